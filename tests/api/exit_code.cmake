# Usage errors of the CLI exit with status 2 (not 1, which means the work itself failed).
foreach(args "bench;--no-such-flag" "bench;--len;0" "bench;--device;gpu"
        "bench;--device;cuda;--dtype;f32" "config" "config;validate" "nope")
  execute_process(COMMAND ${CLI} ${args} RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
  if(NOT rc EQUAL 2)
    message(FATAL_ERROR "minference ${args}: exit status ${rc}, expected 2")
  endif()
  if(NOT err MATCHES "usage:")
    message(FATAL_ERROR "minference ${args}: no usage on stderr")
  endif()
endforeach()
