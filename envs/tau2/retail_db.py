"""The retail domain's database as typed models, field for field as upstream tau2-bench's
``tau2/domains/retail/data_model.py`` (MIT, Sierra Research), so ``model_dump`` and validation errors are upstream's."""

from __future__ import annotations

from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict


class Variant(BaseModel):
    """A specific variant of a product with its options, availability and price."""

    item_id: str
    options: dict[str, str]
    available: bool
    price: float


class Product(BaseModel):
    """A product with its variants."""

    name: str
    product_id: str
    variants: dict[str, Variant]


class UserName(BaseModel):
    """A user's full name."""

    first_name: str
    last_name: str


class UserAddress(BaseModel):
    """A physical address."""

    address1: str
    address2: str
    city: str
    country: str
    state: str
    zip: str


class PaymentMethodBase(BaseModel):
    """A stored payment method."""

    source: str
    id: str


class CreditCard(PaymentMethodBase):
    """A credit card."""

    source: Literal["credit_card"]
    brand: str
    last_four: str


class Paypal(PaymentMethodBase):
    """A PayPal account."""

    source: Literal["paypal"]


class GiftCard(PaymentMethodBase):
    """A gift card with a balance."""

    source: Literal["gift_card"]
    balance: float
    id: str


PaymentMethod = Union[CreditCard, GiftCard, Paypal]  # noqa: UP007


class User(BaseModel):
    """A user with their personal information, payment methods and order history."""

    user_id: str
    name: UserName
    address: UserAddress
    email: str
    payment_methods: dict[str, PaymentMethod]
    orders: list[str]


class OrderFullfilment(BaseModel):
    """The fulfilment details for items in an order."""

    tracking_id: list[str]
    item_ids: list[str]


class OrderItem(BaseModel):
    """An item in an order."""

    name: str
    product_id: str
    item_id: str
    price: float
    options: dict[str, str]


OrderPaymentType = Literal["payment", "refund"]


class OrderPayment(BaseModel):
    """A payment or refund transaction for an order."""

    transaction_type: OrderPaymentType
    amount: float
    payment_method_id: str


OrderStatus = Literal[
    "processed",
    "pending",
    "pending (item modified)",
    "delivered",
    "cancelled",
    "exchange requested",
    "return requested",
]
CancelReason = Literal["no longer needed", "ordered by mistake"]


class Order(BaseModel):
    """An order with its items, status, fulfilment and payment details."""

    order_id: str
    user_id: str
    address: UserAddress
    items: list[OrderItem]
    status: OrderStatus
    fulfillments: list[OrderFullfilment]
    payment_history: list[OrderPayment]
    cancel_reason: Optional[CancelReason] = None  # noqa: UP045
    exchange_items: Optional[list[str]] = None  # noqa: UP045
    exchange_new_items: Optional[list[str]] = None  # noqa: UP045
    exchange_payment_method_id: Optional[str] = None  # noqa: UP045
    exchange_price_difference: Optional[float] = None  # noqa: UP045
    return_items: Optional[list[str]] = None  # noqa: UP045
    return_payment_method_id: Optional[str] = None  # noqa: UP045


class RetailDB(BaseModel):
    """Database containing all retail-related data including products, users and orders."""

    model_config = ConfigDict(extra="forbid")

    products: dict[str, Product]
    users: dict[str, User]
    orders: dict[str, Order]
