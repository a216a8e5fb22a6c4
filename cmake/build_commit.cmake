# cmake -DSRC=<source dir> -DOUT=<header> -P build_commit.cmake, at every
# build: OUT defines QVA_BUILD_COMMIT, the short commit of the git checkout
# whose top is SRC, with "+dirty" when tracked files differ from it, or
# "unknown" (no git, or SRC is not a checkout's top: a tarball, a vendored
# copy).  OUT is rewritten only when that changes, so qva_build_info()'s
# file recompiles once a commit, and a benchmark's library names its source.
set(commit "unknown")
find_package(Git QUIET)
if(GIT_FOUND)
  execute_process(COMMAND ${GIT_EXECUTABLE} -C ${SRC} rev-parse --show-toplevel
                  OUTPUT_VARIABLE top RESULT_VARIABLE r0 OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  get_filename_component(top "${top}" REALPATH)
  get_filename_component(src "${SRC}" REALPATH)
  if(r0 EQUAL 0 AND top STREQUAL src)
    execute_process(COMMAND ${GIT_EXECUTABLE} -C ${SRC} rev-parse --short HEAD
                    OUTPUT_VARIABLE rev RESULT_VARIABLE r1 OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    execute_process(COMMAND ${GIT_EXECUTABLE} -C ${SRC} status --porcelain --untracked-files=no
                    OUTPUT_VARIABLE changes RESULT_VARIABLE r2 ERROR_QUIET)
    if(r1 EQUAL 0 AND rev)
      set(commit "${rev}")
      if(NOT r2 EQUAL 0 OR changes)
        set(commit "${rev}+dirty")
      endif()
    endif()
  endif()
endif()
set(content "#define QVA_BUILD_COMMIT \"${commit}\"\n")
set(old "")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
endif()
if(NOT old STREQUAL content)
  file(WRITE "${OUT}" "${content}")
endif()
