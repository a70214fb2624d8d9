"""The airline domain's database as typed models, field for field as upstream tau2-bench's
``tau2/domains/airline/data_model.py`` (MIT, Sierra Research): the same fields, types, defaults and class names, so
that ``model_dump`` (what the tools return and what the DB hash is taken over) and validation errors are upstream's."""

from __future__ import annotations

from typing import Annotated, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

FlightType = Literal["round_trip", "one_way"]
CabinClass = Literal["business", "economy", "basic_economy"]
Insurance = Literal["yes", "no"]
MembershipLevel = Annotated[Literal["gold", "silver", "regular"], Field(description="Membership level")]


class AirportCode(BaseModel):
    """An airport's IATA code and city."""

    iata: str
    city: str


class Name(BaseModel):
    """A person's name."""

    first_name: str
    last_name: str


class Address(BaseModel):
    """A postal address."""

    address1: str
    address2: Optional[str] = None  # noqa: UP045 (upstream's annotation, kept for identical error texts)
    city: str
    country: str
    state: str
    zip: str


class Payment(BaseModel):
    """One payment (or refund, negative) of a reservation."""

    payment_id: str
    amount: int


class PaymentMethodBase(BaseModel):
    """A stored payment method."""

    source: str
    id: str


class CreditCard(PaymentMethodBase):
    """A credit card."""

    source: Literal["credit_card"]
    brand: str
    last_four: str


class GiftCard(PaymentMethodBase):
    """A gift card with a balance."""

    source: Literal["gift_card"]
    amount: float
    id: str


class Certificate(PaymentMethodBase):
    """A travel certificate with a value."""

    source: Literal["certificate"]
    amount: float


PaymentMethod = Union[CreditCard, GiftCard, Certificate]  # noqa: UP007


class Passenger(BaseModel):
    """A passenger."""

    first_name: str
    last_name: str
    dob: str


SeatPrices = Annotated[dict[CabinClass, int], Field(description="Prices for different cabin classes")]
AvailableSeats = Annotated[dict[CabinClass, int], Field(description="Available seats for different cabin classes")]


class FlightDateStatusAvailable(BaseModel):
    """A flight date that can be booked."""

    status: Literal["available"]
    available_seats: AvailableSeats
    prices: SeatPrices


class FlightDataStatusOnTime(BaseModel):
    """A flight date on time."""

    status: Literal["on time"]
    estimated_departure_time_est: str
    estimated_arrival_time_est: str


class FlightDataStatusFlying(BaseModel):
    """A flight in the air."""

    status: Literal["flying"]
    actual_departure_time_est: str
    estimated_arrival_time_est: str


class FlightDateStatusLanded(BaseModel):
    """A flight that landed."""

    status: Literal["landed"]
    actual_departure_time_est: str
    actual_arrival_time_est: str


class FlightDateStatusCancelled(BaseModel):
    """A cancelled flight date."""

    status: Literal["cancelled"]


class FlightDateStatusDelayed(BaseModel):
    """A delayed flight date."""

    status: Literal["delayed"]
    estimated_departure_time_est: str
    estimated_arrival_time_est: str


FlightDateStatus = Union[  # noqa: UP007
    FlightDateStatusAvailable,
    FlightDateStatusLanded,
    FlightDateStatusCancelled,
    FlightDateStatusDelayed,
    FlightDataStatusFlying,
    FlightDataStatusOnTime,
]


class FlightBase(BaseModel):
    """A flight's number and route."""

    flight_number: str
    origin: str
    destination: str


class Flight(FlightBase):
    """A scheduled flight and its status per date."""

    scheduled_departure_time_est: str
    scheduled_arrival_time_est: str
    dates: dict[str, FlightDateStatus]


class DirectFlight(FlightBase):
    """A search result: one bookable flight on one date."""

    status: Literal["available"]
    scheduled_departure_time_est: str
    scheduled_arrival_time_est: str
    date: Optional[str] = None  # noqa: UP045
    available_seats: AvailableSeats
    prices: SeatPrices


class ReservationFlight(FlightBase):
    """One flight of a reservation, at the price paid per passenger."""

    date: str
    price: int


class FlightInfo(BaseModel):
    """A flight number and date, as the booking tools take them."""

    flight_number: str
    date: str


class User(BaseModel):
    """A customer."""

    user_id: str
    name: Name
    address: Address
    email: str
    dob: str
    payment_methods: dict[str, PaymentMethod]
    saved_passengers: list[Passenger]
    membership: MembershipLevel
    reservations: list[str]


class Reservation(BaseModel):
    """A reservation."""

    reservation_id: str
    user_id: str
    origin: str
    destination: str
    flight_type: FlightType
    cabin: CabinClass
    flights: list[ReservationFlight]
    passengers: list[Passenger]
    payment_history: list[Payment]
    created_at: str
    total_baggages: int
    nonfree_baggages: int
    insurance: Insurance
    status: Optional[Literal["cancelled"]] = None  # noqa: UP045


class FlightDB(BaseModel):
    """Database of all flights, users, and reservations."""

    model_config = ConfigDict(extra="forbid")

    flights: dict[str, Flight]
    users: dict[str, User]
    reservations: dict[str, Reservation]
