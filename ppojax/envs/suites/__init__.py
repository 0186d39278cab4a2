"""One adapter per env suite, each imported only when one of its ids is used."""
