"""DaisyChain-Web: the numeric reference and the Space server (see docs/ARCHITECTURE.md)."""
