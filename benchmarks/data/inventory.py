"""A small inventory module: the file the LSP benchmark types into (see benchmarks/bench_lsp.py)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Item:
    name: str
    price: float
    quantity: int = 0
    tags: list[str] = field(default_factory=list)

    def total(self) -> float:
        return self.price * self.quantity

    def is_available(self) -> bool:
        return self.quantity > 0


class Inventory:
    def __init__(self) -> None:
        self.items: dict[str, Item] = {}

    def add(self, item: Item) -> None:
        if item.name in self.items:
            self.items[item.name].quantity += item.quantity
        else:
            self.items[item.name] = item

    def remove(self, name: str, quantity: int = 1) -> bool:
        item = self.items.get(name)
        if item is None or item.quantity < quantity:
            return False
        item.quantity -= quantity
        return True

    def value(self) -> float:
        return sum(item.total() for item in self.items.values())

    def find(self, tag: str) -> list[Item]:
        return [item for item in self.items.values() if tag in item.tags]

    def cheapest(self) -> Item | None:
        available = [item for item in self.items.values() if item.is_available()]
        if not available:
            return None
        return min(available, key=lambda item: item.price)


def load(rows: list[tuple[str, float, int]]) -> Inventory:
    inventory = Inventory()
    for name, price, quantity in rows:
        inventory.add(Item(name, price, quantity))
    return inventory


if __name__ == "__main__":
    stock = load([("apple", 0.5, 10), ("pear", 0.75, 4), ("fig", 2.0, 0)])
    print(stock.value(), stock.cheapest())
