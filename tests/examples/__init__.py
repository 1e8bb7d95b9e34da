"""The bundled and documented agents, run on a real fleet."""
