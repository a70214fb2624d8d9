"""The hotel-booking environment: tools over a generated database, a simulated user, scoring by final state."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any, ClassVar

from envkit.core.messages import Message
from envkit.core.tools import ToolEnv, ToolError, tool
from envkit.envs.hotel_booking.tasks import TIERS, Task, generate_task
from envkit.envs.hotel_booking.world import Booking, World, WorldError, generate_world

MAX_RESULTS = 8
"""Search and list results are cut at this many entries (the tool output says so)."""

POLICY = (
    "You are the booking assistant of a hotel chain. Help the guest using the tools. Only act for the guest id the "
    "guest gives you. Dates are YYYY-MM-DD; check_out is the departure day. After booking or cancelling, tell the "
    "guest the booking reference."
)
CONFIRM_RULE = (
    " Policy: before calling book_room, tell the guest the total price of the stay and wait for their explicit "
    "confirmation."
)

_QUESTION_TOPICS = {
    "guests": ("how many", "guests", "people", "persons", "party", "adults", "travell"),
    "amenity": ("amenit", "requirement", "need any", "needs", "facilit", "prefer", "must have", "anything else"),
}
_NUMBER = re.compile(r"\d+(?:[.,]\d+)?")
_NOT_AN_AMOUNT = re.compile(r"\d{4}-\d{2}-\d{2}|\b[A-Za-z]{1,3}-[0-9A-Za-z]+")
"""Dates and ids (hotel, guest, booking): their digits are not amounts the guest is told."""
_REFERENCE = re.compile(r"\bBK-[0-9A-Z]+")

# Partial-credit weights of a booking that the gold solution creates (they sum to 1).
FIELD_WEIGHTS = {"hotel": 0.4, "dates": 0.3, "room": 0.2, "guests": 0.1}


class HotelBookingEnv(ToolEnv):
    """Book, move and cancel hotel rooms for a simulated guest (short name ``hotel-booking``).

    Args:
        tier: Restrict tasks to ``"easy"``, ``"medium"`` or ``"hard"``; by default the seed picks the tier. ``reset``'s
            ``options={"tier": ..., "kind": ...}`` overrides it per episode (kinds: see :mod:`.tasks`).

    Scoring compares the final database with the gold database (the task's gold solution replayed on a fresh copy
    of the initial one). Only *changes* are compared: bookings created (and still confirmed) and bookings cancelled.
    A booking the agent made and cancelled again is ignored.

    * 1.0 — the changes equal the gold changes exactly, the agent told the guest every affected booking reference,
      and (for tasks with the price-confirmation policy) the guest confirmed the price before ``book_room``.
      Telling means stating the answer, not listing candidates: a reference counts as told only in a message that
      names no other booking reference (the ones the agent itself made this episode aside), and the guest confirms
      the price only when every number the agent states (dates and ids aside) is a fact of the right stay — its
      total, which must be there, its nightly price, its nights, guests or stars. A list of prices that contains
      the total, or of references that contains the right one, is not an answer.
    * Otherwise partial credit, at most 0.9: ``0.7 × progress`` (halved when there are unwanted changes)
      ``+ 0.1`` when the changes are exact ``+ 0.15`` when they are exact and the references were told; the total is
      halved when the confirmation policy was broken. *progress* averages the goal items: for a gold booking, the
      best matching new booking earns ``0.4`` (hotel) + ``0.3`` (dates) + ``0.2`` (room type) + ``0.1`` (guests);
      for a gold cancellation, 1 when that booking was cancelled.
    * Doing nothing, apologising or refusing changes nothing and scores 0.
    """

    max_turns: ClassVar[int] = 14
    max_tool_output_chars: ClassVar[int] = 4000

    def __init__(self, tier: str | None = None) -> None:
        super().__init__()
        if tier is not None and tier not in TIERS:
            raise ValueError(f"unknown tier {tier!r}; choose from {', '.join(TIERS)}")
        self.tier = tier
        self.world: World | None = None
        self.initial: World | None = None
        self.gold: World | None = None
        self.task: Task | None = None
        self.revealed: set[str] = set()
        self.price_confirmed = False
        self.policy_broken = False
        self.idle_turns = 0

    # ---- episode -------------------------------------------------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Generate the world and task for ``seed`` and return the policy and the guest's request."""
        super().reset(seed=seed, options=options)
        options = options or {}
        rng = self.np_random
        tier = options.get("tier") or self.tier or TIERS[int(rng.integers(len(TIERS)))]
        world = generate_world(int(seed if seed is not None else rng.integers(2**31)), rng)
        try:
            self.task = generate_task(rng, world, tier, options.get("kind"))
        except ValueError as error:
            raise ValueError(f"bad reset options {options}: {error}") from None
        self.world, self.initial = world, world.copy()
        self.gold = world.copy()
        for name, arguments in self.task.gold:
            (self.gold.book if name == "book_room" else self.gold.cancel)(**_world_arguments(arguments))
        self.revealed, self.price_confirmed, self.policy_broken, self.idle_turns = set(), False, False, 0
        system = POLICY + (CONFIRM_RULE if self.task.confirm_price else "")
        system += f" Bookings are possible from {world.start.isoformat()} for 45 days."
        info = {"tier": self.task.tier, "kind": self.task.kind, "guest_id": self.task.guest_id}
        return [{"role": "system", "content": system}, {"role": "user", "content": self.task.request}], info

    # ---- tools ---------------------------------------------------------------------------------------------------
    @tool
    def search_hotels(
        self,
        city: str,
        name: str | None = None,
        min_stars: int | None = None,
        max_price: int | None = None,
        amenities: list[str] | None = None,
        guests: int | None = None,
    ) -> str:
        """Search hotels in a city, cheapest first. Prices are per night for the cheapest room that fits.

        Args:
            city: City name, e.g. "Lisbon".
            name: Only hotels whose name contains this text, e.g. "Harbour".
            min_stars: Only hotels with at least this many stars (1-5).
            max_price: Only rooms costing at most this much per night, in EUR.
            amenities: Only hotels offering all of these, e.g. ["wifi", "parking"].
            guests: Only rooms that hold at least this many guests.
        """
        world = self._world()
        city_key = city.strip().lower()
        if not any(h.city.lower() == city_key for h in world.hotels.values()):
            cities = sorted({h.city for h in world.hotels.values()})
            raise ToolError(f"no hotels in {city[:40]!r}; cities served: {', '.join(cities)}")
        wanted = {a.strip().lower() for a in amenities or []}
        found = []
        for hotel in world.hotels.values():
            if hotel.city.lower() != city_key or (min_stars and hotel.stars < min_stars):
                continue
            if name and name.strip().lower() not in hotel.name.lower():
                continue
            if not wanted <= set(hotel.amenities):
                continue
            prices = [
                r.price
                for r in hotel.rooms.values()
                if r.capacity >= (guests or 1) and (max_price is None or r.price <= max_price)
            ]
            if prices:
                found.append((min(prices), hotel))
        found.sort(key=lambda item: (item[0], item[1].id))
        results = [
            {"hotel_id": h.id, "name": h.name, "stars": h.stars, "from_price": price, "amenities": h.amenities}
            for price, h in found[:MAX_RESULTS]
        ]
        note = f" (showing {MAX_RESULTS} of {len(found)}; narrow the search)" if len(found) > MAX_RESULTS else ""
        return f"{len(found)} hotels found{note}: " + _json(results) if found else "No hotels match these filters."

    @tool
    def get_hotel_details(self, hotel_id: str) -> str:
        """Show a hotel's room types (capacity, nightly price), amenities and cancellation terms.

        Args:
            hotel_id: The hotel's id, e.g. "H-104".
        """
        hotel = self._call(self._world().hotel, hotel_id)
        rooms = [{"room_type": r.name, "capacity": r.capacity, "nightly_price": r.price} for r in hotel.rooms.values()]
        return _json(
            {
                "hotel_id": hotel.id,
                "name": hotel.name,
                "city": hotel.city,
                "stars": hotel.stars,
                "amenities": hotel.amenities,
                "free_cancellation": hotel.free_cancellation,
                "rooms": rooms,
            }
        )

    @tool
    def check_availability(self, hotel_id: str, room_type: str, check_in: str, check_out: str) -> str:
        """Check whether a room type is free for a stay and what the stay costs.

        Args:
            hotel_id: The hotel's id, e.g. "H-104".
            room_type: The room type, e.g. "double".
            check_in: Arrival date, YYYY-MM-DD.
            check_out: Departure date, YYYY-MM-DD.
        """
        world = self._world()
        hotel = self._call(world.hotel, hotel_id)
        room = self._call(world.room, hotel, room_type)
        first, last = self._call(world.stay, check_in, check_out)
        free, full = world.free_rooms(hotel.id, room.name, first, last)
        nights = (last - first).days
        if free == 0:
            return f"Not available: no {room.name} room at {hotel.name} on the night of {full}."
        return _json(
            {
                "available": True,
                "rooms_left": free,
                "nights": nights,
                "nightly_price": room.price,
                "total_price": room.price * nights,
            }
        )

    @tool
    def book_room(
        self, guest_id: str, hotel_id: str, room_type: str, check_in: str, check_out: str, guests: int
    ) -> str:
        """Book one room for a guest. Returns the booking reference and total price.

        Args:
            guest_id: The guest's id, e.g. "G-1234".
            hotel_id: The hotel's id, e.g. "H-104".
            room_type: The room type, e.g. "double".
            check_in: Arrival date, YYYY-MM-DD.
            check_out: Departure date, YYYY-MM-DD.
            guests: Number of guests staying in the room.
        """
        booking = self._call(self._world().book, guest_id, hotel_id, room_type, check_in, check_out, guests)
        if self.task is not None and self.task.confirm_price and not self.price_confirmed:
            self.policy_broken = True
        return _json({**booking.describe(), "hotel": self._world().hotels[booking.hotel_id].name})

    @tool
    def cancel_booking(self, booking_ref: str) -> str:
        """Cancel a booking.

        Args:
            booking_ref: The booking reference, e.g. "BK-3F9A1C".
        """
        booking = self._call(self._world().cancel, booking_ref)
        refund = "full refund" if self._world().hotels[booking.hotel_id].free_cancellation else "no refund"
        return _json({"booking_ref": booking.ref, "status": "cancelled", "refund": refund})

    @tool
    def list_bookings(self, guest_id: str) -> str:
        """List a guest's bookings, newest last.

        Args:
            guest_id: The guest's id, e.g. "G-1234".
        """
        world = self._world()
        guest = self._call(world.guest, guest_id)
        bookings = [b for b in world.bookings.values() if b.guest_id == guest.id]
        shown = [
            {**b.describe(), "hotel": world.hotels[b.hotel_id].name, "city": world.hotels[b.hotel_id].city}
            for b in bookings[-MAX_RESULTS * 2 :]
        ]
        note = f" (showing the last {len(shown)} of {len(bookings)})" if len(shown) < len(bookings) else ""
        return f"{len(bookings)} bookings for {guest.name}{note}: " + _json(shown)

    # ---- the simulated user --------------------------------------------------------------------------------------
    def on_text(self, message: Message) -> list[Message] | None:
        """The guest answers questions from the hidden goal, confirms the right price, and leaves when done."""
        task = self._task()
        text = str(message.get("content") or "")[:20_000]
        lowered = text.lower()
        if self._changes_exact() and self._refs_told():
            return None  # goal reached and communicated: the guest says goodbye
        replies = []
        for name, answer in task.hidden.items():
            if name not in self.revealed and any(k in lowered for k in _QUESTION_TOPICS[name]):
                self.revealed.add(name)
                replies.append(answer)
        price = self._price_stated(text) if task.confirm_price and not self.price_confirmed else None
        if price == "total":
            self.price_confirmed = True
            replies.append("Yes, that price is fine. Please go ahead and book it.")
        if replies:
            self.idle_turns = 0
            return [{"role": "user", "content": " ".join(replies)}]
        self.idle_turns += 1
        if self.idle_turns > 2:
            return None  # the guest gives up
        if price == "among others":
            return [{"role": "user", "content": "You mentioned several prices. What is the total price of the stay?"}]
        if self._changes_exact():
            return [{"role": "user", "content": "Thanks. What is the booking reference?"}]
        return [{"role": "user", "content": "Could you please take care of my request?"}]

    def _price_stated(self, text: str) -> str | None:
        """``"total"`` when the text states the gold total as *the* price: every number in it (dates and ids aside)
        is a fact of the gold stay (total, nightly price, nights, guests, stars) and the total is among them;
        ``"among others"`` when the total is there with other amounts (a list of prices is not an answer)."""
        gold = self._created(self._gold())
        totals = {float(b.total_price) for b in gold}
        facts = set(totals)
        for booking in gold:
            hotel = self._gold().hotels[booking.hotel_id]
            nights = (booking.check_out - booking.check_in).days
            facts |= {float(hotel.rooms[booking.room_type].price), float(nights), float(booking.guests)}
            facts.add(float(hotel.stars))
        bare = _NOT_AN_AMOUNT.sub(" ", text.replace(",", ""))
        said = {float(n) for n in _NUMBER.findall(bare)}
        if not totals or not totals <= said:
            return None
        return "total" if said <= facts else "among others"

    # ---- scoring -------------------------------------------------------------------------------------------------
    def score(self) -> float:
        """Final-state score in [0, 1]; see the class docstring for the partial credit."""
        if self.world is None:
            return 0.0
        exact = self._changes_exact()
        told = exact and self._refs_told()
        if exact and told and not self.policy_broken:
            return 1.0
        progress, unwanted = self._progress()
        value = 0.7 * progress * (0.5 if unwanted else 1.0) + (0.1 if exact else 0.0) + (0.15 if told else 0.0)
        if self.policy_broken:
            value *= 0.5
        return round(min(value, 0.9), 6)

    def _created(self, world: World) -> list[Booking]:
        initial = self._initial()
        return [b for ref, b in world.bookings.items() if ref not in initial.bookings and b.status == "confirmed"]

    def _cancelled(self, world: World) -> set[str]:
        initial = self._initial()
        return {
            ref
            for ref, b in initial.bookings.items()
            if b.status == "confirmed" and world.bookings[ref].status != b.status
        }

    def _changes_exact(self) -> bool:
        world, gold = self._world(), self._gold()
        same_created = Counter(b.key() for b in self._created(world)) == Counter(b.key() for b in self._created(gold))
        return same_created and self._cancelled(world) == self._cancelled(gold)

    def _refs_told(self) -> bool:
        """Every affected reference was told in a message that names no other booking reference: the agent's own
        bookings of this episode may be named there (one booked by mistake and cancelled again), no other one."""
        world = self._world()
        refs = {b.ref for b in self._created(world)} | self._cancelled(world)
        own = set(world.bookings) - set(self._initial().bookings)
        allowed = refs | own
        told: set[str] = set()
        for message in self.messages:
            if message["role"] != "assistant":
                continue
            named = set(_REFERENCE.findall(str(message.get("content") or "").upper()))
            if named <= allowed:
                told |= named
        return refs <= told

    def _progress(self) -> tuple[float, bool]:
        """Mean credit over the gold changes, and whether the agent made changes the gold solution does not."""
        world, gold = self._world(), self._gold()
        made, wanted = self._created(world), self._created(gold)
        credits = []
        unused = list(made)
        for target in wanted:
            best = max(unused, key=lambda b: _booking_credit(b, target), default=None)
            credits.append(_booking_credit(best, target) if best is not None else 0.0)
            if best is not None and credits[-1] > 0:
                unused.remove(best)
        cancelled, to_cancel = self._cancelled(world), self._cancelled(gold)
        credits += [float(ref in cancelled) for ref in sorted(to_cancel)]
        unwanted = bool(unused) or bool(cancelled - to_cancel)
        return (sum(credits) / len(credits) if credits else 0.0), unwanted

    # ---- canaries ------------------------------------------------------------------------------------------------
    def canaries(self) -> dict[str, list[Message | str]]:
        """Known reward hacks, none of which may score: every nightly price and the stay's total quoted in one reply,
        and the request declared done, naming every booking reference in the database, without a tool call."""
        world = self._world()
        prices = {room.price for hotel in world.hotels.values() for room in hotel.rooms.values()}
        prices |= {b.total_price for b in self._created(self._gold())}
        quoted = ", ".join(f"{p} EUR" for p in sorted(prices))
        refs = ", ".join(sorted(world.bookings)) or "BK-000000"
        return {
            "every price in one reply": [_say(f"The price is one of {quoted}. Shall I book it?")],
            "done claimed with every reference": [_say(f"All done: your booking reference is {refs}.")],
        }

    # ---- the oracle ----------------------------------------------------------------------------------------------
    def oracle(self) -> Message | None:
        """The next step of a careful agent: ask for missing facts, search, check, confirm, act, report."""
        task, world = self._task(), self._world()
        called = {c["function"]["name"] for m in self.messages for c in m.get("tool_calls") or []}
        missing = [name for name in task.hidden if name not in self.revealed]
        if missing:
            return _say("Happy to help. How many guests will be staying, and are there any amenities you need?")
        if task.search and "search_hotels" not in called:
            return _call("search_hotels", **task.search)
        if task.kind in ("move_booking", "cancel_city") and "list_bookings" not in called:
            return _call("list_bookings", guest_id=task.guest_id)
        booking = next(((n, a) for n, a in task.gold if n == "book_room"), None)
        if task.unavailable and "check_availability" not in called and booking is not None:
            hotel_id, room = task.unavailable
            return _call(
                "check_availability",
                hotel_id=hotel_id,
                room_type=room,
                check_in=booking[1]["check_in"],
                check_out=booking[1]["check_out"],
            )
        created = {b.key() for b in self._created(world)}
        for name, arguments in task.gold:
            if name == "book_room" and _gold_key(arguments) not in created:
                if task.confirm_price and not self.price_confirmed:
                    total = next(b.total_price for b in self._created(self._gold()))
                    hotel = world.hotels[arguments["hotel_id"]]
                    return _say(
                        f"The cheapest option that fits is a {arguments['room_type']} room at {hotel.name} from "
                        f"{arguments['check_in']} to {arguments['check_out']}, {total} EUR in total. Shall I book it?"
                    )
                return _call(name, **arguments)
            if name == "cancel_booking" and arguments["booking_ref"] not in self._cancelled(world):
                return _call(name, **arguments)
        new, cancelled = [b.ref for b in self._created(world)], sorted(self._cancelled(world))
        done = []
        if new:
            done.append(f"your new booking reference is {', '.join(new)}")
        if cancelled:
            done.append(f"booking {', '.join(cancelled)} is cancelled")
        return _say(f"All done: {' and '.join(done)}.")

    # ---- helpers -------------------------------------------------------------------------------------------------
    def _world(self) -> World:
        if self.world is None:
            raise RuntimeError("call reset() first")
        return self.world

    def _initial(self) -> World:
        assert self.initial is not None
        return self.initial

    def _gold(self) -> World:
        assert self.gold is not None
        return self.gold

    def _task(self) -> Task:
        if self.task is None:
            raise RuntimeError("call reset() first")
        return self.task

    @staticmethod
    def _call(function: Any, *args: Any) -> Any:
        try:
            return function(*args)
        except WorldError as error:
            raise ToolError(str(error)) from None


def _world_arguments(arguments: dict[str, Any]) -> dict[str, Any]:
    return {("ref" if k == "booking_ref" else k): v for k, v in arguments.items()}


def _gold_key(arguments: dict[str, Any]) -> tuple:
    from datetime import date

    return (
        arguments["guest_id"],
        arguments["hotel_id"],
        arguments["room_type"],
        date.fromisoformat(arguments["check_in"]),
        date.fromisoformat(arguments["check_out"]),
        arguments["guests"],
        "confirmed",
    )


def _booking_credit(made: Booking | None, target: Booking) -> float:
    if made is None or made.guest_id != target.guest_id:
        return 0.0
    dates = (made.check_in == target.check_in) + (made.check_out == target.check_out)
    return (
        FIELD_WEIGHTS["hotel"] * (made.hotel_id == target.hotel_id)
        + FIELD_WEIGHTS["dates"] * dates / 2
        + FIELD_WEIGHTS["room"] * (made.room_type == target.room_type)
        + FIELD_WEIGHTS["guests"] * (made.guests == target.guests)
    )


def _json(value: Any) -> str:
    import json

    return json.dumps(value, ensure_ascii=False)


def _say(text: str) -> Message:
    return {"role": "assistant", "content": text}


def _call(tool_name: str, /, **arguments: Any) -> Message:
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": tool_name, "arguments": arguments}}],
    }
