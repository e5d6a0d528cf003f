"""Measurements. Each returns plain records whose field names carry their units."""
