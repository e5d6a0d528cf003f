"""The llama.cpp child process (``python -m quantlab.engine.llama_cpp PATH THREADS CACHE_TYPE N_CTX``): its loop is
``process.worker``. Run as the package's main module, so the package's own import of ``process`` comes first and
the child's module is not imported twice."""
import sys

from .process import worker

worker(sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
