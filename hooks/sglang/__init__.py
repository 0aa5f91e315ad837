"""SGLang integration: plugin entry point, adapter (hook points and argument reading), runner."""
