"""fi-profile: which kernels an LLM engine calls, with which shapes, and which candidate is fastest."""
