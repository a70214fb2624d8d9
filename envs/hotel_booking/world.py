"""The hotel world: a typed database generated from a seed, and the operations the tools run on it.

Everything is deterministic in the seed. Dates are whole days inside a booking window of :data:`WINDOW_DAYS` days;
availability is a per-day count of free rooms for each (hotel, room type). Operations raise :class:`WorldError` for
realistic failures (no availability, invalid dates, over capacity, unknown ids), which the env's tools turn into
tool errors.
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass, field
from datetime import date, timedelta

import numpy as np

WINDOW_DAYS = 45
"""Days in the booking window, starting at :attr:`World.start`."""

CITIES = [
    "Lisbon",
    "Porto",
    "Madrid",
    "Seville",
    "Lyon",
    "Nice",
    "Vienna",
    "Prague",
    "Krakow",
    "Dublin",
    "Edinburgh",
    "Bologna",
    "Florence",
    "Ghent",
    "Utrecht",
    "Bergen",
]
NAME_PARTS = (
    [
        "Grand",
        "Royal",
        "Old Town",
        "Harbour",
        "Riverside",
        "Park",
        "Central",
        "Garden",
        "Station",
        "Plaza",
        "Castle",
        "Bridge",
        "Market",
        "Opera",
        "Cathedral",
        "Lighthouse",
    ],
    ["Hotel", "Inn", "Suites", "Residence", "Lodge", "House", "Palace", "Hostel"],
)
AMENITIES = ["wifi", "breakfast", "parking", "pool", "gym", "spa", "pet-friendly", "airport shuttle"]
ROOM_TYPES = {"single": 1, "double": 2, "twin": 2, "triple": 3, "family": 4, "suite": 2}
"""Room type → capacity (guests)."""
FIRST_NAMES = ["Ana", "Ben", "Chloe", "David", "Elif", "Farah", "Goran", "Hana", "Ivan", "Julia", "Kenji", "Lena"]
LAST_NAMES = ["Silva", "Novak", "Garcia", "Murphy", "Rossi", "Kowalski", "Dubois", "Jensen", "Okafor", "Sato"]


class WorldError(Exception):
    """A realistic failure of a database operation (the message is shown to the agent)."""


@dataclass
class RoomType:
    """One kind of room in a hotel."""

    name: str
    capacity: int
    price: int
    """Nightly price in EUR."""


@dataclass
class Hotel:
    """A hotel with its room types."""

    id: str
    name: str
    city: str
    stars: int
    amenities: list[str]
    rooms: dict[str, RoomType]
    free_cancellation: bool


@dataclass
class Guest:
    """A guest who can hold bookings."""

    id: str
    name: str
    email: str


@dataclass
class Booking:
    """A reservation of one room for a stay (``check_out`` is the departure day, not a night)."""

    ref: str
    guest_id: str
    hotel_id: str
    room_type: str
    check_in: date
    check_out: date
    guests: int
    total_price: int
    status: str = "confirmed"

    def key(self) -> tuple[str, str, str, date, date, int, str]:
        """What identifies a booking's content, independent of its generated reference."""
        return (self.guest_id, self.hotel_id, self.room_type, self.check_in, self.check_out, self.guests, self.status)

    def describe(self) -> dict[str, object]:
        """The booking as the tools show it."""
        return {
            "booking_ref": self.ref,
            "hotel_id": self.hotel_id,
            "room_type": self.room_type,
            "check_in": self.check_in.isoformat(),
            "check_out": self.check_out.isoformat(),
            "guests": self.guests,
            "total_price": self.total_price,
            "status": self.status,
        }


@dataclass
class World:
    """The database: hotels, guests, bookings and the availability calendar."""

    seed: int
    start: date
    hotels: dict[str, Hotel]
    guests: dict[str, Guest]
    bookings: dict[str, Booking]
    availability: dict[tuple[str, str], list[int]]
    """(hotel id, room type) → free rooms per day of the window."""
    next_booking: int = 0
    log: list[str] = field(default_factory=list)

    def copy(self) -> World:
        """A deep copy (the gold solution is replayed on one)."""
        return copy.deepcopy(self)

    # ---- reading -------------------------------------------------------------------------------------------------
    def hotel(self, hotel_id: str) -> Hotel:
        """The hotel with this id, or :class:`WorldError`."""
        hotel = self.hotels.get(hotel_id.strip().upper()) if isinstance(hotel_id, str) else None
        if hotel is None:
            raise WorldError(f"unknown hotel id {hotel_id[:40]!r}; hotel ids look like 'H-104' (use search_hotels)")
        return hotel

    def guest(self, guest_id: str) -> Guest:
        """The guest with this id, or :class:`WorldError`."""
        guest = self.guests.get(guest_id.strip().upper())
        if guest is None:
            raise WorldError(f"unknown guest id {guest_id[:40]!r}; guest ids look like 'G-1234'")
        return guest

    def stay(self, check_in: str, check_out: str) -> tuple[date, date]:
        """Parse and check a stay's dates, or :class:`WorldError`."""
        try:
            first, last = date.fromisoformat(check_in.strip()), date.fromisoformat(check_out.strip())
        except ValueError:
            raise WorldError(f"invalid date {check_in[:30]!r} or {check_out[:30]!r}; use YYYY-MM-DD") from None
        if last <= first:
            raise WorldError("check_out must be after check_in")
        end = self.start + timedelta(days=WINDOW_DAYS)
        if first < self.start or last > end:
            raise WorldError(f"dates must fall between {self.start.isoformat()} and {end.isoformat()}")
        if (last - first).days > 21:
            raise WorldError("stays are limited to 21 nights")
        return first, last

    def nights(self, first: date, last: date) -> range:
        """Day indexes of the nights of a stay."""
        return range((first - self.start).days, (last - self.start).days)

    def free_rooms(self, hotel_id: str, room_type: str, first: date, last: date) -> tuple[int, date | None]:
        """The fewest free rooms over the stay, and the first night with none (or ``None``)."""
        days = self.availability[(hotel_id, room_type)]
        counts = [days[i] for i in self.nights(first, last)]
        full = next((self.start + timedelta(days=i) for i in self.nights(first, last) if days[i] == 0), None)
        return min(counts), full

    def room(self, hotel: Hotel, room_type: str) -> RoomType:
        """A hotel's room type, or :class:`WorldError` listing the ones it has."""
        room = hotel.rooms.get(room_type.strip().lower())
        if room is None:
            raise WorldError(f"{hotel.name} has no room type {room_type[:40]!r}; it has: {', '.join(hotel.rooms)}")
        return room

    # ---- writing -------------------------------------------------------------------------------------------------
    def book(self, guest_id: str, hotel_id: str, room_type: str, check_in: str, check_out: str, guests: int) -> Booking:
        """Reserve a room, or raise :class:`WorldError` (unknown ids, bad dates, capacity, no availability)."""
        guest = self.guest(guest_id)
        hotel = self.hotel(hotel_id)
        room = self.room(hotel, room_type)
        first, last = self.stay(check_in, check_out)
        if guests < 1:
            raise WorldError("guests must be at least 1")
        if guests > room.capacity:
            raise WorldError(f"a {room.name} room holds at most {room.capacity} guests, not {guests}")
        free, full = self.free_rooms(hotel.id, room.name, first, last)
        if free == 0:
            raise WorldError(f"no {room.name} room available at {hotel.name} on the night of {full}")
        for i in self.nights(first, last):
            self.availability[(hotel.id, room.name)][i] -= 1
        ref = self.new_ref()
        booking = Booking(ref, guest.id, hotel.id, room.name, first, last, guests, room.price * (last - first).days)
        self.bookings[ref] = booking
        return booking

    def cancel(self, ref: str) -> Booking:
        """Cancel a confirmed booking and free its rooms, or raise :class:`WorldError`."""
        booking = self.bookings.get(ref.strip().upper())
        if booking is None:
            raise WorldError(f"no booking with reference {ref[:40]!r}")
        if booking.status == "cancelled":
            raise WorldError(f"booking {booking.ref} is already cancelled")
        booking.status = "cancelled"
        for i in self.nights(booking.check_in, booking.check_out):
            self.availability[(booking.hotel_id, booking.room_type)][i] += 1
        return booking

    def new_ref(self) -> str:
        """A fresh booking reference, deterministic in the seed and the number of bookings made."""
        self.next_booking += 1
        digest = hashlib.sha256(f"{self.seed}/{self.next_booking}".encode()).hexdigest().upper()
        return f"BK-{digest[:6]}"


def generate_world(seed: int, rng: np.random.Generator) -> World:
    """A world of 4 cities with 6–9 hotels each, 12 guests and a few existing bookings per guest."""
    start = date(2026, 1, 5) + timedelta(days=int(rng.integers(0, 300)))
    world = World(seed=seed, start=start, hotels={}, guests={}, bookings={}, availability={})
    cities = [str(c) for c in rng.choice(CITIES, size=4, replace=False)]
    hotel_numbers = rng.permutation(np.arange(100, 1000))[:40]
    for city in cities:
        used_names: set[str] = set()
        for _ in range(int(rng.integers(6, 10))):
            while True:
                name = f"{rng.choice(NAME_PARTS[0])} {rng.choice(NAME_PARTS[1])} {city}"
                if name not in used_names:
                    used_names.add(name)
                    break
            stars = int(rng.integers(2, 6))
            kinds = sorted(rng.choice(list(ROOM_TYPES), size=int(rng.integers(2, 5)), replace=False).tolist())
            base = 35 + 22 * stars + int(rng.integers(0, 40))
            rooms = {
                kind: RoomType(kind, ROOM_TYPES[kind], base + 15 * ROOM_TYPES[kind] + int(rng.integers(0, 25)))
                for kind in kinds
            }
            amenities = sorted(rng.choice(AMENITIES, size=int(rng.integers(1, 5)), replace=False).tolist())
            hotel = Hotel(
                id=f"H-{hotel_numbers[len(world.hotels)]}",
                name=name,
                city=city,
                stars=stars,
                amenities=amenities,
                rooms=rooms,
                free_cancellation=bool(rng.random() < 0.7),
            )
            world.hotels[hotel.id] = hotel
            for kind in kinds:
                world.availability[(hotel.id, kind)] = rng.integers(0, 4, size=WINDOW_DAYS).tolist()
    guest_numbers = rng.permutation(np.arange(1000, 10000))[:12]
    for number in guest_numbers:
        first, last = str(rng.choice(FIRST_NAMES)), str(rng.choice(LAST_NAMES))
        guest = Guest(f"G-{number}", f"{first} {last}", f"{first}.{last}{number % 97}@example.com".lower())
        world.guests[guest.id] = guest
    return world
