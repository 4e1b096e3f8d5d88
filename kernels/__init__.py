"""Attention and layer kernels: Triton on CUDA, C++ on the CPU (kernels/cpu), each with a PyTorch reference."""
