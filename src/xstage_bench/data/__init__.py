"""What lies on disk and how it is named and trusted: the raw schema and its checks, provenance,
configs and grids, hardware profiles, dataset comparison."""
