"""The apply engine: buffers of open transactions, net-change compilation and the apply cycle."""
