# Fails when the README's C example differs from examples/api_example.c, which a test compiles.
file(READ ${README} readme)
file(READ ${EXAMPLE} example)
string(FIND "${readme}" "${example}" pos)
if(pos EQUAL -1)
  message(FATAL_ERROR "README.md does not contain examples/api_example.c verbatim")
endif()
