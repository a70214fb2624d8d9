"""Built-in environments, registered with :func:`envkit.make` and Gymnasium on ``import envkit``."""

from envkit.registry import register

BUILTINS: dict[str, tuple[str, str]] = {
    "hotel-booking": ("envkit.envs.hotel_booking:HotelBookingEnv", "envkit/HotelBooking-v0"),
    "guess-number": ("envkit.envs.guess_number:GuessNumberEnv", "envkit/GuessNumber-v0"),
    "arithmetic": ("envkit.envs.arithmetic:ArithmeticEnv", "envkit/Arithmetic-v0"),
    "tau2-airline": ("envkit.envs.tau2:Tau2AirlineEnv", "envkit/Tau2Airline-v0"),
    "tau2-retail": ("envkit.envs.tau2:Tau2RetailEnv", "envkit/Tau2Retail-v0"),
    "bfcl-multi-turn": ("envkit.envs.bfcl:BfclMultiTurnEnv", "envkit/BfclMultiTurn-v0"),
}
"""Short name → (entry point, Gymnasium id)."""

for _name, (_entry_point, _gym_id) in BUILTINS.items():
    register(_name, _entry_point, gym_id=_gym_id)
