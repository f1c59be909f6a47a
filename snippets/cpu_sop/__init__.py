"""Python CPU 侧 SOP：DataLoader、IO (cpu-sop) snippets."""
