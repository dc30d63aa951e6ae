"""Requests shared by the tests and the benchmarks that measure what the tests check."""

# A ~300-token Python snippet; asked back with one identifier renamed, the reply copies most
# of the prompt (the case where drafts from the prompt pay when the model copies faithfully).
BASKET_CODE = '''import json
from dataclasses import dataclass


@dataclass
class Item:
    name: str
    price: float
    quantity: int


def compute_total(items, tax_rate=0.2, discount=0.0):
    """The price of a basket, with tax, after a discount."""
    subtotal = 0.0
    for item in items:
        if item.quantity <= 0:
            continue
        subtotal += item.price * item.quantity
    discounted = subtotal * (1.0 - discount)
    total = discounted * (1.0 + tax_rate)
    return round(total, 2)


def load_items(path):
    with open(path) as fh:
        rows = json.load(fh)
    return [Item(row["name"], float(row["price"]), int(row["quantity"])) for row in rows]


def main(path):
    items = load_items(path)
    print("items:", len(items))
    print("total:", compute_total(items))
'''

RENAME_PROMPT = ("Rename the function compute_total to basket_total everywhere in this code. "
                 "Reply with the whole code and nothing else.\n\n" + BASKET_CODE)
