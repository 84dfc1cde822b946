"""pprof's profile.proto and the classes generated from it (see profile.proto)."""
