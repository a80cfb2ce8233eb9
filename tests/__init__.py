"""asynctier's tests (a package, so that test modules can import ``tests.helpers``)."""
