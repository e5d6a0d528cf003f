"""The run machinery: recipes, the runner and its executors (local, Ray, shards), the variant worker, run
folders (claims, records, views), machine fingerprints and the sensitivity command.

Nothing is imported here, so a module of this package can be read without loading the others."""
