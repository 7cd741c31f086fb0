"""Scripts run from the checkout: `python -m scripts.NAME`."""
