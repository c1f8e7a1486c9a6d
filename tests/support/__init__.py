"""What the tests share: fixtures (imported by the conftest of each folder that uses them),
stand-in devices, workers and servers, and hand-made data. Nothing here is a test."""
