"""The CPU backend: vector micro-kernels, convolution methods, and the kernel table per op."""
