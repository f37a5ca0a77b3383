# generate --prompt-file refuses what is not a whole regular text file, each with its own reason,
# before loading a model: a directory, a FIFO (which would block forever), a device such as
# /dev/zero (which would never end), a missing file, and a file holding a NUL byte.
set(dir ${WORK}/prompt_files)
file(REMOVE_RECURSE ${dir})
file(MAKE_DIRECTORY ${dir})
execute_process(COMMAND mkfifo ${dir}/fifo)
execute_process(COMMAND printf "ab\\0cd" OUTPUT_FILE ${dir}/nul.txt)
foreach(case "${dir}|is a directory" "${dir}/fifo|is not a regular file"
        "/dev/zero|is not a regular file" "${dir}/missing|No such file"
        "${dir}/nul.txt|NUL byte at offset 2")
  string(REPLACE "|" ";" parts "${case}")
  list(GET parts 0 path)
  list(GET parts 1 want)
  execute_process(COMMAND timeout 20 ${CLI} generate --prompt-file ${path} --max-new-tokens 1
                  RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
  if(NOT rc EQUAL 1 OR NOT err MATCHES "${want}")
    message(FATAL_ERROR "generate --prompt-file ${path}: status ${rc}, stderr: ${err}")
  endif()
endforeach()

# A prompt longer than the model's context is refused up front (the demo model's is 8192 tokens),
# unless --allow-long-context; skipped where the demo model is not installed.
string(REPEAT "word " 9000 long_text)
file(WRITE ${dir}/long.txt "${long_text}")
execute_process(COMMAND timeout 120 ${CLI} generate --prompt-file ${dir}/long.txt
                        --max-new-tokens 1 --quiet
                RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
if(err MATCHES "no --model given")
  message(STATUS "long prompt: skipped, no demo model")
elseif(NOT rc EQUAL 1 OR NOT err MATCHES "exceed the model's context of")
  message(FATAL_ERROR "generate with a 9000-token prompt: status ${rc}, stderr: ${err}")
endif()

# A config that does not load: generate and chat keep the loader's detailed reason.
foreach(cmd "generate;--prompt;hi" chat)
  execute_process(COMMAND timeout 60 ${CLI} ${cmd} --max-new-tokens 1
                          --config ${DATA}/bad_pattern.json
                  RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err INPUT_FILE /dev/null)
  if(err MATCHES "no --model given")
    message(STATUS "${cmd} --config: skipped, no demo model")
  elseif(rc EQUAL 0 OR NOT err MATCHES "unknown pattern \"diagonal_magic\"")
    message(FATAL_ERROR "${cmd} --config bad_pattern.json: status ${rc}, stderr: ${err}")
  endif()
endforeach()
