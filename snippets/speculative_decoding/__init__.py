"""投机解码与 EAGLE-3 (speculative-decoding) snippets."""
