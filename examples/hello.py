"""Try llada-lsp here: `llada-lsp complete examples/hello.py:12:15` completes the unfinished line 12."""


def greet(name: str) -> str:
    return f"Hello, {name}!"


def average(values: list[float]) -> float:
    """The mean of `values`; 0.0 when there are none."""
    if not values:
        return 0.0
    return sum


if __name__ == "__main__":
    print(greet("world"), average([1.0, 2.0, 3.0]))
