// Inputs built into the binary, so the demo and benchmarks run from any directory.
#pragma once

namespace packbert::data {

// data/wikipedia_512.hist and data/squad_384.hist as text (`length count` lines).
extern const char* const kWikipedia512Histogram;
extern const char* const kSquad384Histogram;

}  // namespace packbert::data
