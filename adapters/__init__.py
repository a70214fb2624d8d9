"""Bridges from envkit environments to trainers (TRL's GRPOTrainer) and to seed-style env classes."""
