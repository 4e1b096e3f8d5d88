"""Attention and layer kernels: Triton on CUDA, C++ on the CPU (specserve_kernels/cpu), each with a PyTorch
reference. Not named `kernels`: that is Hugging Face's kernel hub package, which transformers (5.25 on) imports
when it is installed, and a package of ours by that name in the working directory would be imported instead."""
