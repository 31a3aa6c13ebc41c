"""State storage: the three SSM state modes and the KV page pools."""
