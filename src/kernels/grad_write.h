// How a backward kernel writes its input gradient.
#pragma once

namespace packbert::kernels {

// Added to what the buffer holds (the default: backward kernels accumulate, so a tensor used
// twice needs no special case), or written over it, for a buffer nothing else writes: no pass to
// zero it first and no read of it back. Parameter gradients always accumulate.
enum class GradWrite { accumulate, overwrite };

}  // namespace packbert::kernels
