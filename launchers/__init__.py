"""What runs on one rank: the Megatron command-line builder and the emulated Megatron (issue 5)."""
