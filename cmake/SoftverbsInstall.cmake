# `cmake --install` (GNUInstallDirs): what goes where.
#
#   bin/softverbs, bin/softverbsd                   component runtime
#   LIBDIR/softverbs/libibverbs.so.1, librdmacm.so.1 component runtime
#     (a private directory: installing never shadows the machine's own
#     libibverbs; `softverbs run` puts it first on LD_LIBRARY_PATH)
#   man1/softverbs.1, man8/softverbsd.8             component runtime
#   include/softverbs/*.h, man3/svx_*.3             component dev
#   LIBDIR/softverbs/libibverbs.so (link-time name) component dev
#   LIBDIR/pkgconfig/softverbs.pc                   component dev
#   LIBDIR/cmake/softverbs/ (softverbs::softverbs)  component dev
#
# The tool finds the private libraries, and the library finds the daemon,
# by paths relative to their own location (computed here), so a DESTDIR
# stage or a moved prefix works as installed.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(SOFTVERBS_PRIVATE_LIBDIR ${CMAKE_INSTALL_LIBDIR}/softverbs)
set(SOFTVERBS_FULL_PRIVATE_LIBDIR ${CMAKE_INSTALL_FULL_LIBDIR}/softverbs)
file(RELATIVE_PATH bin_to_lib ${CMAKE_INSTALL_FULL_BINDIR} ${SOFTVERBS_FULL_PRIVATE_LIBDIR})
file(RELATIVE_PATH lib_to_daemon ${SOFTVERBS_FULL_PRIVATE_LIBDIR} ${CMAKE_INSTALL_FULL_BINDIR}/softverbsd)
set_property(SOURCE ${CMAKE_SOURCE_DIR}/src/tools/softverbs.cc DIRECTORY ${CMAKE_SOURCE_DIR}/src
             APPEND PROPERTY COMPILE_DEFINITIONS SOFTVERBS_BIN_TO_LIB="${bin_to_lib}")
set_property(SOURCE ${CMAKE_SOURCE_DIR}/src/verbs/daemon_conn.cc DIRECTORY ${CMAKE_SOURCE_DIR}/src
             APPEND PROPERTY COMPILE_DEFINITIONS SOFTVERBS_LIB_TO_DAEMON="${lib_to_daemon}")

# The daemon goes to bin, not sbin: every user's programs start their own
# per-user daemon, and users run it by hand (`softverbsd --foreground`); only
# `--system` is an administrator's.
install(TARGETS softverbs softverbsd RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
set_target_properties(ibverbs_dropin PROPERTIES EXPORT_NAME softverbs)
install(TARGETS ibverbs_dropin EXPORT softverbsTargets
        LIBRARY DESTINATION ${SOFTVERBS_PRIVATE_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT dev
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# librdmacm.so.1 finds its libibverbs.so.1 beside it.
set_target_properties(rdmacm_dropin PROPERTIES INSTALL_RPATH "$ORIGIN")
install(TARGETS rdmacm_dropin LIBRARY DESTINATION ${SOFTVERBS_PRIVATE_LIBDIR} COMPONENT runtime NAMELINK_SKIP)
# The RDMA netlink stand-in (`rdma` under softverbs run): the shim and what it loads, side by side.
install(TARGETS netlink_shim nldev_answers LIBRARY DESTINATION ${SOFTVERBS_PRIVATE_LIBDIR} COMPONENT runtime)

install(DIRECTORY ${CMAKE_SOURCE_DIR}/include/softverbs DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT dev
        FILES_MATCHING PATTERN "*.h" PATTERN "*.hpp")

file(GLOB man_pages ${CMAKE_SOURCE_DIR}/docs/man/*.[1-8])
foreach(page IN LISTS man_pages)
  string(REGEX MATCH "[1-8]$" section ${page})
  if(section STREQUAL "3")
    set(component dev)
  else()
    set(component runtime)
  endif()
  install(FILES ${page} DESTINATION ${CMAKE_INSTALL_MANDIR}/man${section} COMPONENT ${component})
endforeach()

# pkg-config: the svx_* API links against softverbs' libibverbs.so.1 in the
# private directory, found at run time through an rpath (README "Install").
# Written at install time, so that `cmake --install --prefix P` names P.
foreach(dir INCLUDEDIR LIBDIR)
  if(IS_ABSOLUTE ${CMAKE_INSTALL_${dir}})
    set(pc_${dir} ${CMAKE_INSTALL_${dir}})
  else()
    set(pc_${dir} "\${prefix}/${CMAKE_INSTALL_${dir}}")
  endif()
endforeach()
install(CODE "set(PC_PREFIX \"\${CMAKE_INSTALL_PREFIX}\")
  set(PC_INCLUDEDIR [=[${pc_INCLUDEDIR}]=])
  set(PC_PRIVATE_LIBDIR [=[${pc_LIBDIR}/softverbs]=])
  set(PROJECT_VERSION ${PROJECT_VERSION})
  configure_file(\"${CMAKE_SOURCE_DIR}/cmake/softverbs.pc.in\" \"${CMAKE_BINARY_DIR}/softverbs.pc\" @ONLY)"
  COMPONENT dev)
install(FILES ${CMAKE_BINARY_DIR}/softverbs.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT dev)

# find_package(softverbs): the imported target softverbs::softverbs.
set(cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/softverbs)
install(EXPORT softverbsTargets NAMESPACE softverbs:: DESTINATION ${cmake_dir} COMPONENT dev)
configure_package_config_file(${CMAKE_SOURCE_DIR}/cmake/softverbsConfig.cmake.in
                              ${CMAKE_BINARY_DIR}/softverbsConfig.cmake INSTALL_DESTINATION ${cmake_dir})
write_basic_package_version_file(${CMAKE_BINARY_DIR}/softverbsConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/softverbsConfig.cmake ${CMAKE_BINARY_DIR}/softverbsConfigVersion.cmake
        DESTINATION ${cmake_dir} COMPONENT dev)

# systemd units (issue 22, item 4): the socket-activated system daemon and a
# user unit for the per-user one. Under PREFIX/lib/systemd (systemd looks in
# /usr/lib and /usr/local/lib); ExecStart names softverbsd without a path,
# which systemd resolves in its fixed search path (/usr/local/bin, /usr/bin).
install(FILES ${CMAKE_SOURCE_DIR}/packaging/systemd/softverbsd.socket ${CMAKE_SOURCE_DIR}/packaging/systemd/softverbsd.service
        DESTINATION lib/systemd/system COMPONENT runtime)
install(FILES ${CMAKE_SOURCE_DIR}/packaging/systemd/user/softverbsd.socket
              ${CMAKE_SOURCE_DIR}/packaging/systemd/user/softverbsd.service
        DESTINATION lib/systemd/user COMPONENT runtime)
