"""Stand-ins for what the tests cannot have on this machine (e.g. a GPU), plugged into the
server through its documented extension points."""
