"""Tasks: a user goal over a generated world, with its gold solution, in three difficulty tiers.

* ``easy`` — ``book_named``: book a named hotel and room type for given dates (the agent must find the hotel id).
* ``medium`` — ``book_cheapest``: constraints (stars, an amenity, party size) that need search and comparison; the
  cheapest matching room is unavailable for the dates, so the agent must check availability and take the next one.
* ``hard`` — one of ``move_booking`` (change an existing booking's dates: rebook and cancel the old one),
  ``cancel_city`` (find and cancel the right one of several bookings), or ``hidden_confirm`` (the user states the
  party size and a required amenity only when asked, and policy requires confirming the total price before booking).

Every task changes the database (a gold solution that is a no-op would make doing nothing a perfect score).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

import numpy as np

from envkit.envs.hotel_booking.world import AMENITIES, WINDOW_DAYS, World, WorldError

TIERS = ("easy", "medium", "hard")
HARD_KINDS = ("move_booking", "cancel_city", "hidden_confirm")


@dataclass
class Task:
    """One user goal and how to reach it."""

    tier: str
    kind: str
    guest_id: str
    request: str
    """The user's opening message."""
    gold: list[tuple[str, dict]]
    """Tool calls (name, arguments) that solve the task; replayed on a copy of the world to get the gold state."""
    city: str
    search: dict = field(default_factory=dict)
    """``search_hotels`` arguments a careful agent would use (the oracle's search)."""
    hidden: dict[str, str] = field(default_factory=dict)
    """Facts the user states only when asked: name → the user's answer."""
    confirm_price: bool = False
    """Policy: the total price must be confirmed by the user before ``book_room``."""
    unavailable: tuple[str, str] | None = None
    """The (hotel id, room type) a naive agent picks first, which is full for the dates."""


def _book(guest_id: str, hotel_id: str, room: str, check_in: str, check_out: str, guests: int) -> tuple[str, dict]:
    """A gold ``book_room`` call."""
    return "book_room", {
        "guest_id": guest_id,
        "hotel_id": hotel_id,
        "room_type": room,
        "check_in": check_in,
        "check_out": check_out,
        "guests": guests,
    }


def _stay(rng: np.random.Generator, world: World) -> tuple[str, str, list[int]]:
    nights = int(rng.integers(1, 6))
    first = int(rng.integers(1, WINDOW_DAYS - nights - 1))
    check_in = world.start + timedelta(days=first)
    return check_in.isoformat(), (check_in + timedelta(days=nights)).isoformat(), list(range(first, first + nights))


def _open(world: World, hotel_id: str, room: str, nights: list[int]) -> None:
    days = world.availability[(hotel_id, room)]
    for i in nights:
        days[i] = max(days[i], 1)


def _guest_intro(world: World, guest_id: str) -> str:
    return f"Hi, I'm {world.guests[guest_id].name} (guest id {guest_id})."


def _add_existing_bookings(rng: np.random.Generator, world: World, guest_id: str, count: int, avoid: str) -> None:
    """Give a guest bookings in cities other than ``avoid`` (distractors for list/cancel tasks)."""
    hotels = [h for h in world.hotels.values() if h.city != avoid]
    for _ in range(count):
        hotel = hotels[int(rng.integers(len(hotels)))]
        room = sorted(hotel.rooms)[int(rng.integers(len(hotel.rooms)))]
        check_in, check_out, nights = _stay(rng, world)
        _open(world, hotel.id, room, nights)
        world.book(guest_id, hotel.id, room, check_in, check_out, 1)


def _candidates(world: World, city: str, guests: int, min_stars: int, amenity: str | None) -> list[tuple[str, str]]:
    """(hotel id, room type) pairs that meet the constraints, cheapest first."""
    pairs = [
        (hotel.id, room.name)
        for hotel in world.hotels.values()
        if hotel.city == city and hotel.stars >= min_stars and (amenity is None or amenity in hotel.amenities)
        for room in hotel.rooms.values()
        if room.capacity >= guests
    ]
    return sorted(pairs, key=lambda p: (world.hotels[p[0]].rooms[p[1]].price, p))


def _cheapest_setup(
    rng: np.random.Generator, world: World, city: str, guests: int, min_stars: int, amenity: str | None
) -> tuple[tuple[str, str], tuple[str, str], str, str] | None:
    """Make the cheapest matching room full for a stay and the next one strictly cheaper than the rest and free."""
    pairs = _candidates(world, city, guests, min_stars, amenity)
    if len(pairs) < 2:
        return None
    check_in, check_out, nights = _stay(rng, world)
    blocked, gold = pairs[0], pairs[1]
    price = world.hotels[gold[0]].rooms[gold[1]].price
    if world.hotels[blocked[0]].rooms[blocked[1]].price == price:
        world.hotels[blocked[0]].rooms[blocked[1]].price = price - 1
    for hotel_id, room in pairs[2:]:  # strictly more expensive: the gold choice is unambiguous
        other = world.hotels[hotel_id].rooms[room]
        other.price = max(other.price, price + 1)
    world.availability[blocked][nights[int(rng.integers(len(nights)))]] = 0
    _open(world, *gold, nights)
    return blocked, gold, check_in, check_out


def generate_task(rng: np.random.Generator, world: World, tier: str, kind: str | None = None) -> Task:
    """Prepare ``world`` for a task of ``tier`` (bookings, availability) and return the task."""
    if tier not in TIERS:
        raise ValueError(f"unknown tier {tier!r}; choose from {', '.join(TIERS)}")
    if tier == "hard" and kind is None:
        kind = HARD_KINDS[int(rng.integers(len(HARD_KINDS)))]
    guest_id = sorted(world.guests)[int(rng.integers(len(world.guests)))]
    intro = _guest_intro(world, guest_id)
    cities = sorted({h.city for h in world.hotels.values()})
    if tier == "easy":
        city = cities[int(rng.integers(len(cities)))]
        hotel = sorted((h for h in world.hotels.values() if h.city == city), key=lambda h: h.id)[
            int(rng.integers(sum(h.city == city for h in world.hotels.values())))
        ]
        room = sorted(hotel.rooms)[int(rng.integers(len(hotel.rooms)))]
        guests = int(rng.integers(1, hotel.rooms[room].capacity + 1))
        check_in, check_out, nights = _stay(rng, world)
        _open(world, hotel.id, room, nights)
        people = "1 guest" if guests == 1 else f"{guests} guests"
        return Task(
            tier,
            "book_named",
            guest_id,
            f"{intro} Please book a {room} room at {hotel.name} in {city} from {check_in} to {check_out} for {people}.",
            [_book(guest_id, hotel.id, room, check_in, check_out, guests)],
            city,
            search={"city": city, "name": hotel.name.removesuffix(f" {city}")},
        )
    if tier == "medium" or kind == "hidden_confirm":
        hidden = tier == "hard"
        for _ in range(200):
            city = cities[int(rng.integers(len(cities)))]
            guests = int(rng.integers(2, 5)) if hidden else int(rng.integers(1, 4))
            amenity = str(rng.choice(AMENITIES))
            min_stars = 2 if hidden else int(rng.integers(2, 5))
            setup = _cheapest_setup(rng, world, city, guests, min_stars, amenity)
            if setup is not None:
                break
        else:  # pragma: no cover - worlds always have enough hotels
            raise WorldError("could not build a comparison task for this world")
        blocked, (hotel_id, room), check_in, check_out = setup
        gold = [_book(guest_id, hotel_id, room, check_in, check_out, guests)]
        people = f"{guests} guests" if guests > 1 else "1 guest"
        if not hidden:
            return Task(
                tier,
                "book_cheapest",
                guest_id,
                f"{intro} I need a room in {city} from {check_in} to {check_out} for {people}, in a hotel with at "
                f"least {min_stars} stars that offers {amenity}. Please book the cheapest room that fits and is "
                "available.",
                gold,
                city,
                search={"city": city, "min_stars": min_stars, "amenities": [amenity], "guests": guests},
                unavailable=blocked,
            )
        return Task(
            tier,
            "hidden_confirm",
            guest_id,
            f"{intro} I need a room in {city} from {check_in} to {check_out}. Please book the cheapest room that "
            "suits us and is available.",
            gold,
            city,
            search={"city": city, "amenities": [amenity], "guests": guests},
            hidden={"guests": f"We are {people}.", "amenity": f"The hotel must offer {amenity}."},
            confirm_price=True,
            unavailable=blocked,
        )
    if kind == "move_booking":
        city = cities[int(rng.integers(len(cities)))]
        _add_existing_bookings(rng, world, guest_id, int(rng.integers(1, 3)), avoid=city)
        hotel = sorted((h for h in world.hotels.values() if h.city == city), key=lambda h: h.id)[0]
        room = sorted(hotel.rooms)[int(rng.integers(len(hotel.rooms)))]
        old_in, old_out, old_nights = _stay(rng, world)
        _open(world, hotel.id, room, old_nights)
        guests = int(rng.integers(1, hotel.rooms[room].capacity + 1))
        old = world.book(guest_id, hotel.id, room, old_in, old_out, guests)
        while True:
            check_in, check_out, nights = _stay(rng, world)
            if (check_in, check_out) != (old_in, old_out):
                break
        _open(world, hotel.id, room, nights)
        return Task(
            tier,
            "move_booking",
            guest_id,
            f"{intro} I have a booking at {hotel.name} in {city} from {old_in} to {old_out}. Please move it to "
            f"{check_in} until {check_out}, same room type and number of guests.",
            [
                _book(guest_id, hotel.id, room, check_in, check_out, guests),
                ("cancel_booking", dict(booking_ref=old.ref)),
            ],
            city,
        )
    # cancel_city: several bookings in other cities, one in the city to cancel
    city = cities[int(rng.integers(len(cities)))]
    _add_existing_bookings(rng, world, guest_id, int(rng.integers(1, 4)), avoid=city)
    hotel = sorted((h for h in world.hotels.values() if h.city == city), key=lambda h: h.id)[-1]
    room = sorted(hotel.rooms)[0]
    check_in, check_out, nights = _stay(rng, world)
    _open(world, hotel.id, room, nights)
    target = world.book(guest_id, hotel.id, room, check_in, check_out, 1)
    return Task(
        tier,
        "cancel_city",
        guest_id,
        f"{intro} My trip to {city} is off. Please cancel my booking there.",
        [("cancel_booking", dict(booking_ref=target.ref))],
        city,
    )
