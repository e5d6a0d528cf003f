"""Joint planning of weights and KV cache under a memory budget at a serving workload (``quantlab plan``): each
option's divergence measured (``kv_scan`` for the cache, the sensitivity scan for the weights), its bytes at the
workload (``kv.format.layer_kv_bytes``), and the least-divergence choice within a budget over weight groups and KV
layers together, exactly (``joint``)."""
