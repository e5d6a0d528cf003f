"""Joint planning of weights and KV cache under a memory budget at a serving workload (``quantlab plan``): the
memory each choice costs at the workload (``memory``) and the least-divergence choice within a budget, exactly, over
weight groups and KV-cache layers together (``joint``)."""
