"""`sim`: the simulated cloud; its instances are `simhost` hosts on this machine."""
