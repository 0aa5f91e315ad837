"""Agent traces: read them in any form people have (seed-001 typed list, seed-001 conversation,
OpenAI-compatible request/response logs from vLLM or SGLang servers), and show them as one page."""
