# ruff: noqa: E501  (upstream's tool descriptions, verbatim: one line per argument, as the schema reads them)
"""The airline domain's tools, ported from upstream tau2-bench's ``tau2/domains/airline/tools.py`` (MIT, Sierra
Research) with the same semantics, results and error texts; as envkit ``@tool`` methods over :class:`FlightDB`."""

from copy import deepcopy
from typing import Any

from envkit.core.tools import tool
from envkit.envs.tau2 import calculator
from envkit.envs.tau2.airline_db import (
    AirportCode,
    Certificate,
    DirectFlight,
    Flight,
    FlightDateStatusAvailable,
    FlightDB,
    FlightInfo,
    Passenger,
    Payment,
    Reservation,
    ReservationFlight,
    User,
)
from envkit.envs.tau2.common import ToolsBase, upstream, write

AIRPORTS = [
    ("SFO", "San Francisco"), ("JFK", "New York"), ("LAX", "Los Angeles"), ("ORD", "Chicago"), ("DFW", "Dallas"),
    ("DEN", "Denver"), ("SEA", "Seattle"), ("ATL", "Atlanta"), ("MIA", "Miami"), ("BOS", "Boston"),
    ("PHX", "Phoenix"), ("IAH", "Houston"), ("LAS", "Las Vegas"), ("MCO", "Orlando"), ("EWR", "Newark"),
    ("CLT", "Charlotte"), ("MSP", "Minneapolis"), ("DTW", "Detroit"), ("PHL", "Philadelphia"), ("LGA", "LaGuardia"),
]  # fmt: skip


def _as_models(model: type, items: Any) -> Any:
    """Upstream's ``if all(isinstance(x, dict) for x in items): items = [Model(**x) for x in items]``: the items as
    models when every one is a dict, else as they are. Tool arguments reach the tools unchecked, as in tau2, so a
    list sent as JSON text stays a string here and fails later with upstream's own text."""
    if all(isinstance(item, dict) for item in items):
        return [model(**item) for item in items]
    return items


class AirlineTools(ToolsBase):
    """All the tools of the airline domain (``self.db`` is a :class:`FlightDB`)."""

    db: FlightDB

    def _get_user(self, user_id: str) -> User:
        if user_id not in self.db.users:
            raise ValueError(f"User {user_id} not found")
        return self.own("users", user_id)

    def _get_reservation(self, reservation_id: str) -> Reservation:
        if reservation_id not in self.db.reservations:
            raise ValueError(f"Reservation {reservation_id} not found")
        return self.own("reservations", reservation_id)

    def _get_flight(self, flight_number: str) -> Flight:
        if flight_number not in self.db.flights:
            raise ValueError(f"Flight {flight_number} not found")
        return self.own("flights", flight_number)

    def _get_flight_instance(self, flight_number: str, date: str) -> Any:
        flight = self._get_flight(flight_number)
        if date not in flight.dates:
            raise ValueError(f"Flight {flight_number} not found on date {date}")
        return flight.dates[date]

    def _new_reservation_id(self) -> str:
        for reservation_id in ["HATHAT", "HATHAU", "HATHAV"]:
            if reservation_id not in self.db.reservations:
                return reservation_id
        raise ValueError("Too many reservations")

    def _search_direct_flight(
        self, date: str, origin: Any = None, destination: Any = None, leave_after: Any = None
    ) -> list[DirectFlight]:
        results = []
        for flight in self.db.flights.values():
            if (
                (origin is None or flight.origin == origin)
                and (destination is None or flight.destination == destination)
                and (date in flight.dates)
                and (flight.dates[date].status == "available")
                and (leave_after is None or flight.scheduled_departure_time_est >= leave_after)
            ):
                results.append(
                    DirectFlight(
                        flight_number=flight.flight_number,
                        origin=flight.origin,
                        destination=flight.destination,
                        status="available",
                        scheduled_departure_time_est=flight.scheduled_departure_time_est,
                        scheduled_arrival_time_est=flight.scheduled_arrival_time_est,
                        available_seats=flight.dates[date].available_seats,
                        prices=flight.dates[date].prices,
                    )
                )
        return results

    def _payment_for_update(self, user: User, payment_id: str, total_price: int) -> Payment | None:
        if payment_id not in user.payment_methods:
            raise ValueError("Payment method not found")
        payment_method = user.payment_methods[payment_id]
        if payment_method.source == "certificate":
            raise ValueError("Certificate cannot be used to update reservation")
        if payment_method.source == "gift_card" and payment_method.amount < total_price:
            raise ValueError("Gift card balance is not enough")
        if payment_method.source == "gift_card":
            payment_method.amount -= total_price
        return Payment(payment_id=payment_id, amount=total_price) if total_price != 0 else None

    @tool
    @upstream
    @write
    def book_reservation(
        self,
        user_id: str,
        origin: str,
        destination: str,
        flight_type: str,
        cabin: str,
        flights: list[dict],
        passengers: list[dict],
        payment_methods: list[dict],
        total_baggages: int,
        nonfree_baggages: int,
        insurance: str,
    ) -> str:
        """Book a reservation.

        Args:
            user_id: The ID of the user to book the reservation such as 'sara_doe_496'.
            origin: The IATA code for the origin city such as 'SFO'.
            destination: The IATA code for the destination city such as 'JFK'.
            flight_type: The type of flight such as 'one_way' or 'round_trip'.
            cabin: The cabin class such as 'basic_economy', 'economy', or 'business'.
            flights: An array of objects containing details about each piece of flight: {"flight_number", "date"}.
            passengers: An array of objects containing details about each passenger: {"first_name", "last_name", "dob"}.
            payment_methods: An array of objects containing details about each payment method: {"payment_id", "amount"}.
            total_baggages: The total number of baggage items to book the reservation.
            nonfree_baggages: The number of non-free baggage items to book the reservation.
            insurance: Whether the reservation has insurance: 'yes' or 'no'.
        """
        flight_infos = _as_models(FlightInfo, flights)
        people = _as_models(Passenger, passengers)
        payments = _as_models(Payment, payment_methods)
        user = self._get_user(user_id)
        reservation_id = self._new_reservation_id()
        reservation = Reservation(
            reservation_id=reservation_id,
            user_id=user_id,
            origin=origin,
            destination=destination,
            flight_type=flight_type,
            cabin=cabin,
            flights=[],
            passengers=deepcopy(people),
            payment_history=deepcopy(payments),
            created_at="2024-05-15T15:00:00",
            total_baggages=total_baggages,
            nonfree_baggages=nonfree_baggages,
            insurance=insurance,
        )
        total_price = 0
        all_dates: list[FlightDateStatusAvailable] = []
        for flight_info in flight_infos:
            flight_number = flight_info.flight_number
            flight = self._get_flight(flight_number)
            date_data = self._get_flight_instance(flight_number, flight_info.date)
            if not isinstance(date_data, FlightDateStatusAvailable):
                raise ValueError(f"Flight {flight_number} not available on date {flight_info.date}")
            if date_data.available_seats[cabin] < len(people):
                raise ValueError(f"Not enough seats on flight {flight_number}")
            price = date_data.prices[cabin]
            reservation.flights.append(
                ReservationFlight(
                    origin=flight.origin,
                    destination=flight.destination,
                    flight_number=flight_number,
                    date=flight_info.date,
                    price=price,
                )
            )
            all_dates.append(date_data)
            total_price += price * len(people)
        if insurance == "yes":
            total_price += 30 * len(people)
        total_price += 50 * nonfree_baggages
        for payment in payments:
            if payment.payment_id not in user.payment_methods:
                raise ValueError(f"Payment method {payment.payment_id} not found")
            method = user.payment_methods[payment.payment_id]
            if method.source in {"gift_card", "certificate"} and method.amount < payment.amount:
                raise ValueError(f"Not enough balance in payment method {payment.payment_id}")
        total_payment = sum(payment.amount for payment in payments)
        if total_payment != total_price:
            raise ValueError(f"Payment amount does not add up, total price is {total_price}, but paid {total_payment}")
        for payment in payments:
            method = user.payment_methods[payment.payment_id]
            if method.source == "gift_card":
                method.amount -= payment.amount
            elif method.source == "certificate":
                user.payment_methods.pop(payment.payment_id)
        for date_data in all_dates:
            date_data.available_seats[cabin] -= len(people)
        self.db.reservations[reservation_id] = reservation
        self.own("users", user_id).reservations.append(reservation_id)
        return reservation

    @tool
    @upstream
    def calculate(self, expression: str) -> str:
        """Calculate the result of a mathematical expression.

        Args:
            expression: The mathematical expression to calculate, such as '2 + 2'. The expression can contain numbers, operators (+, -, *, /), parentheses, and spaces.
        """
        return calculator.calculate(expression)

    @tool
    @upstream
    @write
    def cancel_reservation(self, reservation_id: str) -> str:
        """Cancel the whole reservation.

        Args:
            reservation_id: The reservation ID, such as 'ZFA04Y'.
        """
        reservation = self._get_reservation(reservation_id)
        refunds = [Payment(payment_id=p.payment_id, amount=-p.amount) for p in reservation.payment_history]
        reservation.payment_history.extend(refunds)
        reservation.status = "cancelled"
        return reservation  # upstream releases no seats on cancellation either

    @tool
    @upstream
    def get_reservation_details(self, reservation_id: str) -> str:
        """Get the details of a reservation.

        Args:
            reservation_id: The reservation ID, such as '8JX2WO'.
        """
        return self._get_reservation(reservation_id)

    @tool
    @upstream
    def get_user_details(self, user_id: str) -> str:
        """Get the details of a user, including their reservations.

        Args:
            user_id: The user ID, such as 'sara_doe_496'.
        """
        return self._get_user(user_id)

    @tool
    @upstream
    def list_all_airports(self) -> str:
        """Returns a list of all available airports."""
        return [AirportCode(iata=iata, city=city) for iata, city in AIRPORTS]

    @tool
    @upstream
    def search_direct_flight(self, origin: str, destination: str, date: str) -> str:
        """Search for direct flights between two cities on a specific date.

        Args:
            origin: The origin city airport in three letters, such as 'JFK'.
            destination: The destination city airport in three letters, such as 'LAX'.
            date: The date of the flight in the format 'YYYY-MM-DD', such as '2024-01-01'.
        """
        return self._search_direct_flight(date=date, origin=origin, destination=destination)

    @tool
    @upstream
    def search_onestop_flight(self, origin: str, destination: str, date: str) -> str:
        """Search for one-stop flights between two cities on a specific date.

        Args:
            origin: The origin city airport in three letters, such as 'JFK'.
            destination: The destination city airport in three letters, such as 'LAX'.
            date: The date of the flight in the format 'YYYY-MM-DD', such as '2024-05-01'.
        """
        results = []
        for first in self._search_direct_flight(date=date, origin=origin, destination=None):
            first.date = date
            date2 = f"2024-05-{int(date[-2:]) + 1}" if "+1" in first.scheduled_arrival_time_est else date
            for second in self._search_direct_flight(
                date=date2,
                origin=first.destination,
                destination=destination,
                leave_after=first.scheduled_arrival_time_est,
            ):
                second.date = date2
                results.append([first, second])
        return results

    @tool
    @upstream
    @write
    def send_certificate(self, user_id: str, amount: int) -> str:
        """Send a certificate to a user. Be careful!

        Args:
            user_id: The ID of the user to book the reservation, such as 'sara_doe_496'.
            amount: The amount of the certificate to send.
        """
        user = self._get_user(user_id)
        for payment_id in [f"certificate_{number}" for number in (3221322, 3221323, 3221324)]:
            if payment_id not in user.payment_methods:
                user.payment_methods[payment_id] = Certificate(id=payment_id, amount=amount, source="certificate")
                return f"Certificate {payment_id} added to user {user_id} with amount {amount}."
        raise ValueError("Too many certificates")

    @tool
    @upstream
    def transfer_to_human_agents(self, summary: str) -> str:
        """Transfer the user to a human agent, with a summary of the user's issue. Only transfer if the user explicitly
        asks for a human agent, or given the policy and the available tools, you cannot solve the user's issue.

        Args:
            summary: A summary of the user's issue.
        """
        return "Transfer successful"

    @tool
    @upstream
    @write
    def update_reservation_baggages(
        self, reservation_id: str, total_baggages: int, nonfree_baggages: int, payment_id: str
    ) -> str:
        """Update the baggage information of a reservation.

        Args:
            reservation_id: The reservation ID, such as 'ZFA04Y'.
            total_baggages: The updated total number of baggage items included in the reservation.
            nonfree_baggages: The updated number of non-free baggage items included in the reservation.
            payment_id: The payment id stored in user profile, such as 'credit_card_7815826', 'gift_card_7815826', 'certificate_7815826'.
        """
        reservation = self._get_reservation(reservation_id)
        user = self._get_user(reservation.user_id)
        total_price = 50 * max(0, nonfree_baggages - reservation.nonfree_baggages)
        payment = self._payment_for_update(user, payment_id, total_price)
        if payment is not None:
            reservation.payment_history.append(payment)
        reservation.total_baggages = total_baggages
        reservation.nonfree_baggages = nonfree_baggages
        return reservation

    @tool
    @upstream
    @write
    def update_reservation_flights(self, reservation_id: str, cabin: str, flights: list[dict], payment_id: str) -> str:
        """Update the flight information of a reservation.

        Args:
            reservation_id: The reservation ID, such as 'ZFA04Y'.
            cabin: The cabin class of the reservation.
            flights: An array of objects containing details about each piece of flight in the ENTIRE new reservation: {"flight_number", "date"}. Even if the a flight segment is not changed, it should still be included in the array.
            payment_id: The payment id stored in user profile, such as 'credit_card_7815826', 'gift_card_7815826', 'certificate_7815826'.
        """
        flight_infos = _as_models(FlightInfo, flights)
        reservation = self._get_reservation(reservation_id)
        user = self._get_user(reservation.user_id)
        total_price = 0
        new_flights = []
        for flight_info in flight_infos:
            kept = next(
                (
                    existing
                    for existing in reservation.flights
                    if existing.flight_number == flight_info.flight_number
                    and existing.date == flight_info.date
                    and cabin == reservation.cabin
                ),
                None,
            )
            if kept:
                total_price += kept.price * len(reservation.passengers)
                new_flights.append(kept)
                continue
            flight = self._get_flight(flight_info.flight_number)
            date_data = self._get_flight_instance(flight_info.flight_number, flight_info.date)
            if not isinstance(date_data, FlightDateStatusAvailable):
                raise ValueError(f"Flight {flight_info.flight_number} not available on date {flight_info.date}")
            if date_data.available_seats[cabin] < len(reservation.passengers):
                raise ValueError(f"Not enough seats on flight {flight_info.flight_number}")
            new_flight = ReservationFlight(
                flight_number=flight_info.flight_number,
                date=flight_info.date,
                price=date_data.prices[cabin],
                origin=flight.origin,
                destination=flight.destination,
            )
            total_price += new_flight.price * len(reservation.passengers)
            new_flights.append(new_flight)
        total_price -= sum(flight.price for flight in reservation.flights) * len(reservation.passengers)
        payment = self._payment_for_update(user, payment_id, total_price)
        if payment is not None:
            reservation.payment_history.append(payment)
        reservation.flights = new_flights
        reservation.cabin = cabin
        return reservation

    @tool
    @upstream
    @write
    def update_reservation_passengers(self, reservation_id: str, passengers: list[dict]) -> str:
        """Update the passenger information of a reservation.

        Args:
            reservation_id: The reservation ID, such as 'ZFA04Y'.
            passengers: An array of objects containing details about each passenger: {"first_name", "last_name", "dob"}.
        """
        people = _as_models(Passenger, passengers)
        reservation = self._get_reservation(reservation_id)
        if len(people) != len(reservation.passengers):
            raise ValueError("Number of passengers does not match")
        reservation.passengers = deepcopy(people)
        return reservation

    @tool
    @upstream
    def get_flight_status(self, flight_number: str, date: str) -> str:
        """Get the status of a flight.

        Args:
            flight_number: The flight number.
            date: The date of the flight.
        """
        return self._get_flight_instance(flight_number, date).status
