"""Envs from elsewhere, coming in as envkit envs: OpenEnv servers (``openenv:``), MCP tool servers (``mcp:``),
reasoning-gym (``reasoning-gym:``), TextArena (``textarena:``), TextWorldExpress (``textworld-express:``), ScienceWorld
(``scienceworld:``) and TRL/seed-style env classes (``trl:``, ``seed:``).
Each module is loaded on demand through :data:`envkit.registry.ADAPTER_FAMILIES`."""
