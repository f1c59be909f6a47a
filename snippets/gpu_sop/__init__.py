"""问题定位 SOP：GPU 低利用率、NCCL hang、推理吞吐 (gpu-sop) snippets."""
