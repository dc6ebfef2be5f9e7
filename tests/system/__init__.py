"""System tests: whole releases, clusters, the CLI with real key files, real data."""
