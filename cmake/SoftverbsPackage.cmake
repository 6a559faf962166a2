# Debian packages (issue 22, item 3), with CPack's DEB generator, from the
# components of cmake/SoftverbsInstall.cmake:
#
#   softverbs      component runtime: the tool, the daemon, the drop-in
#                  libraries in LIBDIR/softverbs, man pages 1 and 8, the
#                  systemd units; maintainer scripts in packaging/debian/
#   softverbs-dev  component dev: headers, man3, softverbs.pc, the CMake package
#
#   cpack --config BUILD/CPackConfig.cmake -G DEB -B OUT    (scripts/package.sh)
#
# Depends come from dpkg-shlibdeps (libc6 alone: GCC's C++ runtime is linked
# in, SOFTVERBS_STATIC_CXX_RUNTIME; softverbs needs nothing of rdma-core to
# run). Configure with
# -DCMAKE_INSTALL_PREFIX=/usr for Debian's multiarch LIBDIR; another prefix
# still packages under /usr, with LIBDIR as GNUInstallDirs chose it.
set(CPACK_GENERATOR DEB)
# The Debian revision: a rebuild of the same source is 0.1.0-2.
set(SOFTVERBS_DEB_RELEASE 1 CACHE STRING "the Debian revision of the packages (cpack -G DEB)")
set(CPACK_PACKAGE_NAME softverbs)
set(CPACK_PACKAGE_VENDOR softverbs)
set(CPACK_PACKAGE_CONTACT "softverbs developers <softverbs@users.noreply.github.com>")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
# Debug information stays in the build tree; the packages carry stripped binaries.
set(CPACK_STRIP_FILES ON)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL runtime dev)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_RELEASE ${SOFTVERBS_DEB_RELEASE})
set(CPACK_DEBIAN_PACKAGE_SECTION net)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# librdmacm.so.1 needs the libibverbs.so.1 beside it, in the same package.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ${SOFTVERBS_FULL_PRIVATE_LIBDIR})
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
# Man pages gzipped, as Debian ships them.
set(CPACK_PRE_BUILD_SCRIPTS ${CMAKE_SOURCE_DIR}/packaging/debian/compress-man.cmake)

set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME softverbs)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SECTION net)
# (CPack indents the long description and writes an empty line as " .")
set(CPACK_COMPONENT_RUNTIME_DESCRIPTION "user-space software RDMA device
softverbs gives programs written for the verbs API (libibverbs, librdmacm)
an RDMA device with no RDMA hardware and no kernel module: drop-in
libibverbs.so.1 and librdmacm.so.1, in a private directory that never
shadows the machine's own, and the daemon softverbsd.

'softverbs run CMD' runs one program on it; 'softverbs enable' (root)
gives it to every program on the machine, for a CI runner or a container.
The socket-activated system daemon is softverbsd.socket.")
set(CPACK_DEBIAN_RUNTIME_PACKAGE_CONTROL_EXTRA
    ${CMAKE_SOURCE_DIR}/packaging/debian/postinst
    ${CMAKE_SOURCE_DIR}/packaging/debian/prerm
    ${CMAKE_SOURCE_DIR}/packaging/debian/postrm)

set(CPACK_DEBIAN_DEV_PACKAGE_NAME softverbs-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
# The headers include rdma-core's <infiniband/verbs.h>.
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "softverbs (= ${PROJECT_VERSION}-${SOFTVERBS_DEB_RELEASE}), libibverbs-dev")
set(CPACK_DEBIAN_DEV_PACKAGE_SHLIBDEPS OFF)
set(CPACK_COMPONENT_DEV_DESCRIPTION "user-space software RDMA device: the svx_* API
Headers, man pages, pkg-config and CMake files for programs that use the
svx_* extensions of softverbs' libibverbs.so.1 (softverbs.pc,
find_package(softverbs)).")
# Debian policy 12.5 and 12.7: each package's /usr/share/doc/PACKAGE holds
# the copyright file (machine-readable, DEP-5) and changelog.Debian.gz
# (packaging/debian/changelog.in, this version; gzip -9n: no name or time
# stamp, so the same tree gives the same package).
set(SOFTVERBS_DEB_VERSION ${PROJECT_VERSION}-${SOFTVERBS_DEB_RELEASE})
configure_file(${CMAKE_SOURCE_DIR}/packaging/debian/changelog.in ${CMAKE_BINARY_DIR}/debian/changelog.Debian @ONLY)
execute_process(COMMAND gzip -9nf ${CMAKE_BINARY_DIR}/debian/changelog.Debian RESULT_VARIABLE gzip_rc)
if(NOT gzip_rc EQUAL 0)
  message(FATAL_ERROR "gzip ${CMAKE_BINARY_DIR}/debian/changelog.Debian failed")
endif()
foreach(pkg_component softverbs:runtime softverbs-dev:dev)
  string(REPLACE ":" ";" pc ${pkg_component})
  list(GET pc 0 pkg)
  list(GET pc 1 component)
  install(FILES ${CMAKE_SOURCE_DIR}/packaging/debian/copyright ${CMAKE_BINARY_DIR}/debian/changelog.Debian.gz
          DESTINATION ${CMAKE_INSTALL_DATAROOTDIR}/doc/${pkg} COMPONENT ${component})
endforeach()
include(CPack)
