"""The sandbox: worker processes that run conch programs, and the kernel layers that confine them."""
