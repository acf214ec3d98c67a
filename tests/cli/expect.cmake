# SPDX-License-Identifier: MIT
# Helpers of the command-line test scripts (cmake -P): run(CMD...) sets rc, out and err;
# expect(COND WHAT) fails the script with the last command's output unless COND holds.
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                  TIMEOUT 300)
  set(rc ${rc} PARENT_SCOPE)
  set(out "${out}" PARENT_SCOPE)
  set(err "${err}" PARENT_SCOPE)
endfunction()

function(expect cond what)
  cmake_language(EVAL CODE "if(${cond})\n set(pass TRUE)\n else()\n set(pass FALSE)\n endif()")
  if(NOT pass)
    message(FATAL_ERROR "FAIL: ${what}\nrc=${rc}\nstdout:\n${out}\nstderr:\n${err}")
  endif()
  message(STATUS "ok: ${what}")
endfunction()
