"""heapscope agent: continuous watching of processes, served to Prometheus."""
