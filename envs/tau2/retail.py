# ruff: noqa: E501  (upstream's tool descriptions, verbatim: one line per argument, as the schema reads them)
"""The retail domain's tools, ported from upstream tau2-bench's ``tau2/domains/retail/tools.py`` (MIT, Sierra
Research) with the same semantics, results and error texts (quirks included: ``modify_pending_order_items`` prices
every modified item at the last new item's price, as upstream does); as envkit ``@tool`` methods over
:class:`RetailDB`."""

import json
from typing import Any

from envkit.core.tools import tool
from envkit.envs.tau2 import calculator
from envkit.envs.tau2.common import ToolsBase, upstream, write
from envkit.envs.tau2.retail_db import GiftCard, Order, OrderPayment, Product, RetailDB, User, UserAddress, Variant


class RetailTools(ToolsBase):
    """All the tools of the retail domain (``self.db`` is a :class:`RetailDB`)."""

    db: RetailDB

    def _get_order(self, order_id: str) -> Order:
        if order_id not in self.db.orders:
            raise ValueError("Order not found")
        return self.own("orders", order_id)

    def _get_user(self, user_id: str) -> User:
        if user_id not in self.db.users:
            raise ValueError("User not found")
        return self.own("users", user_id)

    def _get_product(self, product_id: str) -> Product:
        if product_id not in self.db.products:
            raise ValueError("Product not found")
        return self.db.products[product_id]

    def _get_variant(self, product_id: str, variant_id: str) -> Variant:
        product = self._get_product(product_id)
        if variant_id not in product.variants:
            raise ValueError("Variant not found")
        return product.variants[variant_id]

    def _get_payment_method(self, user_id: str, payment_method_id: str) -> Any:
        user = self._get_user(user_id)
        if payment_method_id not in user.payment_methods:
            raise ValueError("Payment method not found")
        return user.payment_methods[payment_method_id]

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
    def cancel_pending_order(self, order_id: str, reason: str) -> str:
        """Cancel a pending order. If the order is already processed or delivered, it cannot be cancelled. The agent
        needs to explain the cancellation detail and ask for explicit user confirmation (yes/no) to proceed. If the user
        confirms, the order status will be changed to 'cancelled' and the payment will be refunded. The refund will be
        added to the user's gift card balance immediately if the payment was made using a gift card, otherwise the
        refund would take 5-7 business days to process. The function returns the order details after the cancellation.

        Args:
            order_id: The order id, such as '#W0000000'. Be careful there is a '#' symbol at the beginning of the order id.
            reason: The reason for cancellation, which should be either 'no longer needed' or 'ordered by mistake'.
        """
        order = self._get_order(order_id)
        if order.status != "pending":
            raise ValueError("Non-pending order cannot be cancelled")
        if reason not in {"no longer needed", "ordered by mistake"}:
            raise ValueError("Invalid reason")
        refunds = []
        for payment in order.payment_history:
            payment_id = payment.payment_method_id
            refunds.append(OrderPayment(transaction_type="refund", amount=payment.amount, payment_method_id=payment_id))
            user = self._get_user(order.user_id)
            method = self._get_payment_method(user.user_id, payment_id)
            if isinstance(method, GiftCard):
                method.balance += payment.amount
                method.balance = round(method.balance, 2)
        order.status = "cancelled"
        order.cancel_reason = reason
        order.payment_history.extend(refunds)
        return order

    @tool
    @upstream
    @write
    def exchange_delivered_order_items(
        self, order_id: str, item_ids: list[str], new_item_ids: list[str], payment_method_id: str
    ) -> str:
        """Exchange items in a delivered order to new items of the same product type. For a delivered order, return or
        exchange can be only done once by the agent. The agent needs to explain the exchange detail and ask for explicit
        user confirmation (yes/no) to proceed.

        Args:
            order_id: The order id, such as '#W0000000'. Be careful there is a '#' symbol at the beginning of the order id.
            item_ids: The item ids to be exchanged, each such as '1008292230'. There could be duplicate items in the list.
            new_item_ids: The item ids to be exchanged for, each such as '1008292230'. There could be duplicate items in the list. Each new item id should match the item id in the same position and be of the same product.
            payment_method_id: The payment method id to pay or receive refund for the item price difference, such as 'gift_card_0000000' or 'credit_card_0000000'. These can be looked up from the user or order details.
        """
        order = self._get_order(order_id)
        if order.status != "delivered":
            raise ValueError("Non-delivered order cannot be exchanged")
        all_item_ids = [item.item_id for item in order.items]
        for item_id in item_ids:
            if item_ids.count(item_id) > all_item_ids.count(item_id):
                raise ValueError(f"Number of {item_id} not found.")
        if len(item_ids) != len(new_item_ids):
            raise ValueError("The number of items to be exchanged should match.")
        diff_price = 0
        for item_id, new_item_id in zip(item_ids, new_item_ids, strict=False):
            item = next((item for item in order.items if item.item_id == item_id), None)
            if item is None:
                raise ValueError(f"Item {item_id} not found")
            variant = self._get_variant(item.product_id, new_item_id)
            if not variant.available:
                raise ValueError(f"New item {new_item_id} not found or available")
            diff_price += variant.price - item.price
        diff_price = round(diff_price, 2)
        method = self._get_payment_method(order.user_id, payment_method_id)
        if isinstance(method, GiftCard) and method.balance < diff_price:
            raise ValueError("Insufficient gift card balance to pay for the price difference")
        order.status = "exchange requested"
        order.exchange_items = sorted(item_ids)
        order.exchange_new_items = sorted(new_item_ids)
        order.exchange_payment_method_id = payment_method_id
        order.exchange_price_difference = diff_price
        return order

    @tool
    @upstream
    def find_user_id_by_name_zip(self, first_name: str, last_name: str, zip: str) -> str:
        """Find user id by first name, last name, and zip code. If the user is not found, the function will return an
        error message. By default, find user id by email, and only call this function if the user is not found by email
        or cannot remember email.

        Args:
            first_name: The first name of the customer, such as 'John'.
            last_name: The last name of the customer, such as 'Doe'.
            zip: The zip code of the customer, such as '12345'.
        """
        for user_id, user in self.db.users.items():
            if (
                user.name.first_name.lower() == first_name.lower()
                and user.name.last_name.lower() == last_name.lower()
                and user.address.zip == zip
            ):
                return user_id
        raise ValueError("User not found")

    @tool
    @upstream
    def find_user_id_by_email(self, email: str) -> str:
        """Find user id by email. If the user is not found, the function will return an error message.

        Args:
            email: The email of the user, such as 'something@example.com'.
        """
        for user_id, user in self.db.users.items():
            if user.email.lower() == email.lower():
                return user_id
        raise ValueError("User not found")

    @tool
    @upstream
    def get_order_details(self, order_id: str) -> str:
        """Get the status and details of an order.

        Args:
            order_id: The order id, such as '#W0000000'. Be careful there is a '#' symbol at the beginning of the order id.
        """
        return self._get_order(order_id)

    @tool
    @upstream
    def get_product_details(self, product_id: str) -> str:
        """Get the inventory details of a product.

        Args:
            product_id: The product id, such as '6086499569'. Be careful the product id is different from the item id.
        """
        return self._get_product(product_id)

    @tool
    @upstream
    def get_user_details(self, user_id: str) -> str:
        """Get the details of a user, including their orders.

        Args:
            user_id: The user id, such as 'sara_doe_496'.
        """
        return self._get_user(user_id)

    @tool
    @upstream
    def list_all_product_types(self) -> str:
        """List the name and product id of all product types. Each product type has a variety of different items with
        unique item ids and options. There are only 50 product types in the store."""
        return json.dumps({p.name: p.product_id for p in self.db.products.values()}, sort_keys=True)

    @tool
    @upstream
    @write
    def modify_pending_order_address(
        self, order_id: str, address1: str, address2: str, city: str, state: str, country: str, zip: str
    ) -> str:
        """Modify the shipping address of a pending order. The agent needs to explain the modification detail and ask
        for explicit user confirmation (yes/no) to proceed.

        Args:
            order_id: The order id, such as '#W0000000'. Be careful there is a '#' symbol at the beginning of the order id.
            address1: The first line of the address, such as '123 Main St'.
            address2: The second line of the address, such as 'Apt 1' or ''.
            city: The city, such as 'San Francisco'.
            state: The state, such as 'CA'.
            country: The country, such as 'USA'.
            zip: The zip code, such as '12345'.
        """
        order = self._get_order(order_id)
        if "pending" not in order.status:
            raise ValueError("Non-pending order cannot be modified")
        order.address = UserAddress(
            address1=address1, address2=address2, city=city, state=state, country=country, zip=zip
        )
        return order

    @tool
    @upstream
    @write
    def modify_pending_order_items(
        self, order_id: str, item_ids: list[str], new_item_ids: list[str], payment_method_id: str
    ) -> str:
        """Modify items in a pending order to new items of the same product type. For a pending order, this function
        can only be called once. The agent needs to explain the exchange detail and ask for explicit user confirmation
        (yes/no) to proceed.

        Args:
            order_id: The order id, such as '#W0000000'. Be careful there is a '#' symbol at the beginning of the order id.
            item_ids: The item ids to be modified, each such as '1008292230'. There could be duplicate items in the list.
            new_item_ids: The item ids to be modified for, each such as '1008292230'. There could be duplicate items in the list. Each new item id should match the item id in the same position and be of the same product.
            payment_method_id: The payment method id to pay or receive refund for the item price difference, such as 'gift_card_0000000' or 'credit_card_0000000'. These can be looked up from the user or order details.
        """
        order = self._get_order(order_id)
        if order.status != "pending":
            raise ValueError("Non-pending order cannot be modified")
        all_item_ids = [item.item_id for item in order.items]
        for item_id in item_ids:
            if item_ids.count(item_id) > all_item_ids.count(item_id):
                raise ValueError(f"{item_id} not found")
        if len(item_ids) != len(new_item_ids):
            raise ValueError("The number of items to be exchanged should match")
        diff_price = 0
        variant = None
        for item_id, new_item_id in zip(item_ids, new_item_ids, strict=False):
            if item_id == new_item_id:
                raise ValueError("The new item id should be different from the old item id")
            item = next((item for item in order.items if item.item_id == item_id), None)
            if item is None:
                raise ValueError(f"Item {item_id} not found")
            variant = self._get_variant(item.product_id, new_item_id)
            if not variant.available:
                raise ValueError(f"New item {new_item_id} not found or available")
            diff_price += variant.price - item.price
        method = self._get_payment_method(order.user_id, payment_method_id)
        if isinstance(method, GiftCard) and method.balance < diff_price:
            raise ValueError("Insufficient gift card balance to pay for the new item")
        order.payment_history.append(
            OrderPayment(
                transaction_type="payment" if diff_price > 0 else "refund",
                amount=abs(diff_price),
                payment_method_id=payment_method_id,
            )
        )
        if isinstance(method, GiftCard):
            method.balance -= diff_price
            method.balance = round(method.balance, 2)
        for item_id, new_item_id in zip(item_ids, new_item_ids, strict=False):
            item = next((item for item in order.items if item.item_id == item_id), None)
            if item is None:
                raise ValueError(f"Item {item_id} not found")
            item.item_id = new_item_id
            item.price = variant.price  # type: ignore[union-attr]  (upstream: the last variant's price)
            item.options = variant.options  # type: ignore[union-attr]
        order.status = "pending (item modified)"
        return order

    @tool
    @upstream
    @write
    def modify_pending_order_payment(self, order_id: str, payment_method_id: str) -> str:
        """Modify the payment method of a pending order. The agent needs to explain the modification detail and ask for
        explicit user confirmation (yes/no) to proceed.

        Args:
            order_id: The order id, such as '#W0000000'. Be careful there is a '#' symbol at the beginning of the order id.
            payment_method_id: The payment method id to pay or receive refund for the item price difference, such as 'gift_card_0000000' or 'credit_card_0000000'. These can be looked up from the user or order details.
        """
        order = self._get_order(order_id)
        if "pending" not in order.status:
            raise ValueError("Non-pending order cannot be modified")
        method = self._get_payment_method(order.user_id, payment_method_id)
        if len(order.payment_history) != 1 or order.payment_history[0].transaction_type != "payment":
            raise ValueError("There should be exactly one payment for a pending order")
        if order.payment_history[0].payment_method_id == payment_method_id:
            raise ValueError("The new payment method should be different from the current one")
        amount = order.payment_history[0].amount
        if isinstance(method, GiftCard) and method.balance < amount:
            raise ValueError("Insufficient gift card balance to pay for the order")
        order.payment_history.extend(
            [
                OrderPayment(transaction_type="payment", amount=amount, payment_method_id=payment_method_id),
                OrderPayment(
                    transaction_type="refund",
                    amount=amount,
                    payment_method_id=order.payment_history[0].payment_method_id,
                ),
            ]
        )
        if isinstance(method, GiftCard):
            method.balance -= amount
            method.balance = round(method.balance, 2)
        old_method = self._get_payment_method(order.user_id, order.payment_history[0].payment_method_id)
        if isinstance(old_method, GiftCard):
            old_method.balance += amount
            old_method.balance = round(old_method.balance, 2)
        return order

    @tool
    @upstream
    @write
    def modify_user_address(
        self, user_id: str, address1: str, address2: str, city: str, state: str, country: str, zip: str
    ) -> str:
        """Modify the default address of a user. The agent needs to explain the modification detail and ask for
        explicit user confirmation (yes/no) to proceed.

        Args:
            user_id: The user id, such as 'sara_doe_496'.
            address1: The first line of the address, such as '123 Main St'.
            address2: The second line of the address, such as 'Apt 1' or ''.
            city: The city, such as 'San Francisco'.
            state: The state, such as 'CA'.
            country: The country, such as 'USA'.
            zip: The zip code, such as '12345'.
        """
        user = self._get_user(user_id)
        user.address = UserAddress(
            address1=address1, address2=address2, city=city, state=state, country=country, zip=zip
        )
        return user

    @tool
    @upstream
    @write
    def return_delivered_order_items(self, order_id: str, item_ids: list[str], payment_method_id: str) -> str:
        """Return some items of a delivered order. The order status will be changed to 'return requested'. The agent
        needs to explain the return detail and ask for explicit user confirmation (yes/no) to proceed. The user will
        receive follow-up email for how and where to return the item.

        Args:
            order_id: The order id, such as '#W0000000'. Be careful there is a '#' symbol at the beginning of the order id.
            item_ids: The item ids to be returned, each such as '1008292230'. There could be duplicate items in the list.
            payment_method_id: The payment method id to pay or receive refund for the item price difference, such as 'gift_card_0000000' or 'credit_card_0000000'. These can be looked up from the user or order details.
        """
        order = self._get_order(order_id)
        if order.status != "delivered":
            raise ValueError("Non-delivered order cannot be returned")
        user = self._get_user(order.user_id)
        method = self._get_payment_method(user.user_id, payment_method_id)
        if not isinstance(method, GiftCard) and payment_method_id != order.payment_history[0].payment_method_id:
            raise ValueError("Payment method should be the original payment method")
        all_item_ids = [item.item_id for item in order.items]
        for item_id in item_ids:
            if item_ids.count(item_id) > all_item_ids.count(item_id):
                raise ValueError("Some item not found")
        order.status = "return requested"
        order.return_items = sorted(item_ids)
        order.return_payment_method_id = payment_method_id
        return order

    @tool
    @upstream
    def transfer_to_human_agents(self, summary: str) -> str:
        """Transfer the user to a human agent, with a summary of the user's issue. Only transfer if the user explicitly
        asks for a human agent, or given the policy and the available tools, you cannot solve the user's issue.

        Args:
            summary: A summary of the user's issue.
        """
        return "Transfer successful"
