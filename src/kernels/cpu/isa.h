// The cpu backend is compiled once per instruction set the build serves (CMakeLists.txt: the
// build's own flags, and an AVX2 build beside an AVX-512 or a generic one), each into its own
// inline namespace kernels::PACKBERT_CPU_ISA, so the builds' symbols never mix at link time;
// kernels/ops.cpp chooses between them at run time (features.h's cap). Code outside the cpu
// backend that calls its kernels directly (tests, benches) gets the build's own flags.
#pragma once

#ifndef PACKBERT_CPU_ISA
#define PACKBERT_CPU_ISA build_isa
#endif
