# Fails when the README's C example differs from examples/api_example.c, which a test compiles,
# when a row of the results store breaks its schema, or when a results table of README.md or
# docs/performance.md differs from what scripts/results.py renders from the store.
file(READ ${README} readme)
file(READ ${EXAMPLE} example)
string(FIND "${readme}" "${example}" pos)
if(pos EQUAL -1)
  message(FATAL_ERROR "README.md does not contain examples/api_example.c verbatim")
endif()
if(RESULTS)
  if(NOT PYTHON)
    find_program(MI_PYTHON NAMES python3 python REQUIRED)
    set(PYTHON ${MI_PYTHON})
  endif()
  foreach(cmd check "render;--check")
    execute_process(COMMAND ${PYTHON} ${RESULTS} ${cmd} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                    ERROR_VARIABLE err)
    if(NOT rc EQUAL 0)
      string(REPLACE ";" " " cmd "${cmd}")
      message(FATAL_ERROR "scripts/results.py ${cmd}: ${out}${err}")
    endif()
    message(STATUS "${out}")
  endforeach()
endif()
