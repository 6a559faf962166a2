# CPACK_PRE_BUILD_SCRIPTS (cmake/SoftverbsPackage.cmake): Debian ships man
# pages compressed (gzip -9n: no name or time stamp, so the same tree gives
# the same package). Runs on the staged files, before the packages are made.
file(GLOB_RECURSE pages "${CPACK_TEMPORARY_INSTALL_DIRECTORY}/*.[1-8]")
list(FILTER pages INCLUDE REGEX "/share/man/man[1-8]/[^/]+$")
foreach(page IN LISTS pages)
  execute_process(COMMAND gzip -9nf "${page}" RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "gzip ${page} failed")
  endif()
endforeach()
