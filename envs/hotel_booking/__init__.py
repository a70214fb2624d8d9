"""Hotel booking, envkit's flagship environment: a generated hotel database, tools that read and write it, a
simulated guest, and scoring by the final database state (modelled on tau2-bench's airline/retail domains).

Modules: :mod:`.world` (typed data model and database operations), :mod:`.tasks` (goals in three tiers, each with a
gold solution), :mod:`.env` (the :class:`HotelBookingEnv` tools, simulated user, score and oracle).
"""

from envkit.envs.hotel_booking.env import HotelBookingEnv

__all__ = ["HotelBookingEnv"]
