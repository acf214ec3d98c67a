message(STATUS placeholder)
