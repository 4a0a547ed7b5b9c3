"""HTTP emulators of provider APIs (real servers on 127.0.0.1) for adapter and engine tests."""
