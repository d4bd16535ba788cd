// The shape of a batch of images for the convolution and pooling ops of backend.h; plain
// data, so the CUDA kernels (built by nvcc) share it.
#pragma once

namespace meridian::kernels {

// Square images, channels last (NHWC): element (n, y, x, c) of a tensor of this shape is at
// ((n * side + y) * side + x) * channels + c.
struct ImageShape {
  int batch = 0;
  int side = 0;
  int channels = 0;
};

}  // namespace meridian::kernels
