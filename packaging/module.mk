# packaging/: the systemd unit, sysusers.d and tmpfiles.d files, the default
# configuration and the man pages; debian/ builds the .debs from them.
#
#   make install-packaging     (the top-level `install` should depend on it)
#   make check-systemd         the end-to-end test under a real systemd
#                              (systemd-nspawn; builds its cached root first)
#   make deb                   the .debs into $(DEB_DIR), then lintian
UNITDIR     ?= $(or $(shell $(PKG_CONFIG) --variable=systemdsystemunitdir systemd 2>/dev/null),/usr/lib/systemd/system)
SYSUSERSDIR ?= $(or $(shell $(PKG_CONFIG) --variable=sysusersdir systemd 2>/dev/null),/usr/lib/sysusers.d)
TMPFILESDIR ?= $(or $(shell $(PKG_CONFIG) --variable=tmpfilesdir systemd 2>/dev/null),/usr/lib/tmpfiles.d)
MANDIR      ?= $(PREFIX)/share/man

PACKAGING_MAN := packaging/man/edgelmctl.1 packaging/man/edgelm-bench.1 packaging/man/edgelm-gguf.1 \
		 packaging/man/edgelm-quantize.1 packaging/man/edgelm-perplexity.1 packaging/man/edgelm-run.1 packaging/man/edgelm.conf.5 \
		 packaging/man/edgelmd.8

# The dashboard, alert rules and scrape example (docs/operations.md), for
# the operator to import: /usr/share/edgelm/{grafana,prometheus}/.
DATADIR ?= $(PREFIX)/share
PACKAGING_MONITORING := packaging/grafana/edgelm.json packaging/prometheus/edgelm-rules.yml \
			packaging/prometheus/edgelm-fleet.yml packaging/prometheus/edgelm-fleet-targets.json \
			packaging/prometheus/scrape-example.yml

.PHONY: install-packaging uninstall-packaging check-systemd deb

# The unit names /usr/sbin/edgelmd and /etc/edgelm: rewritten for other
# SBINDIR/SYSCONFDIR. An existing edgelm.conf is never overwritten.
install-packaging:
	install -d $(DESTDIR)$(UNITDIR)
	sed -e 's|/usr/sbin/edgelmd|$(SBINDIR)/edgelmd|g' -e 's|/etc/edgelm/|$(SYSCONFDIR)/edgelm/|g' \
		packaging/systemd/edgelmd.service > $(DESTDIR)$(UNITDIR)/edgelmd.service
	chmod 0644 $(DESTDIR)$(UNITDIR)/edgelmd.service
	install -D -m 0644 packaging/sysusers.d/edgelm.conf $(DESTDIR)$(SYSUSERSDIR)/edgelm.conf
	install -D -m 0644 packaging/tmpfiles.d/edgelm.conf $(DESTDIR)$(TMPFILESDIR)/edgelm.conf
	install -d $(DESTDIR)$(SYSCONFDIR)/edgelm
	if [ -e $(DESTDIR)$(SYSCONFDIR)/edgelm/edgelm.conf ]; then \
		echo "keeping $(DESTDIR)$(SYSCONFDIR)/edgelm/edgelm.conf"; \
	else \
		install -m 0644 packaging/edgelm.conf $(DESTDIR)$(SYSCONFDIR)/edgelm/edgelm.conf; \
	fi
	for m in $(PACKAGING_MAN); do \
		s=$${m##*.}; install -D -m 0644 $$m $(DESTDIR)$(MANDIR)/man$$s/$${m##*/}; \
	done
	for f in $(PACKAGING_MONITORING); do \
		install -D -m 0644 $$f $(DESTDIR)$(DATADIR)/edgelm/$${f#packaging/}; \
	done

# The configuration stays (it may hold the admin's changes), as dpkg does.
uninstall-packaging:
	rm -f $(DESTDIR)$(UNITDIR)/edgelmd.service $(DESTDIR)$(SYSUSERSDIR)/edgelm.conf \
	      $(DESTDIR)$(TMPFILESDIR)/edgelm.conf
	for m in $(PACKAGING_MAN); do s=$${m##*.}; rm -f $(DESTDIR)$(MANDIR)/man$$s/$${m##*/}; done
	for f in $(PACKAGING_MONITORING); do rm -f $(DESTDIR)$(DATADIR)/edgelm/$${f#packaging/}; done

# Needs root, systemd-nspawn and debootstrap (apt-get install
# systemd-container debootstrap); the root is cached in
# /var/cache/edgelm-test/root (EDGELM_E2E_ROOT), outside the tree.
# Then the packages' lifecycle (install to purge, tests/integration/
# systemd_deb.sh) on .debs built without their tests into build-deb-e2e.
check-systemd: all
	EDGELM_E2E_BUILD_ROOT=1 BUILD=$(BUILD) bash tests/integration/systemd_e2e.sh
	DEB_BUILD_OPTIONS=nocheck $(MAKE) --no-print-directory deb DEB_DIR=build-deb-e2e LINTIAN=
	EDGELM_E2E_BUILD_ROOT=1 EDGELM_DEB_DIR=build-deb-e2e BUILD=$(BUILD) \
		bash tests/integration/systemd_deb.sh

# The .debs (dpkg-buildpackage -b, unsigned), built in a copy of this tree
# under $(DEB_DIR)/src: debian/rules clean runs `make clean` (rm -rf build
# build-*), which must not remove this tree's builds. The .debs, .buildinfo
# and .changes end in $(DEB_DIR); lintian, when installed, then fails on any
# error or warning (LINTIAN= skips it). The package build runs the tests but
# the live-load ones (debian/rules); DEB_BUILD_OPTIONS=nocheck skips them all.
# Needs dpkg-dev and debhelper (packaging/build-deps), lintian for the check.
DEB_DIR            ?= build-deb
DEB_BUILD_ARGS     ?= -us -uc -b -jauto
LINTIAN            ?= $(shell command -v lintian 2>/dev/null)
EDGELM_DEB_VERSION = $(shell dpkg-parsechangelog -l debian/changelog -S Version)
DEB_SRC             = $(DEB_DIR)/src/edgelm-$(EDGELM_DEB_VERSION)

deb:
	rm -rf $(DEB_DIR)/src
	rm -f $(DEB_DIR)/*.deb $(DEB_DIR)/*.buildinfo $(DEB_DIR)/*.changes
	mkdir -p $(DEB_SRC)
	tar -c --exclude=./.git --exclude=./build --exclude='./build-*' . | tar -x -C $(DEB_SRC)
	cd $(DEB_SRC) && EDGELM_TESTDATA=$${EDGELM_TESTDATA:-$(CURDIR)/../shared} \
		dpkg-buildpackage $(DEB_BUILD_ARGS)
	mv $(DEB_DIR)/src/*.deb $(DEB_DIR)/src/*.buildinfo $(DEB_DIR)/src/*.changes $(DEB_DIR)/
	rm -rf $(DEB_DIR)/src
	@ls -1 $(DEB_DIR)/*.deb
	$(if $(LINTIAN),$(LINTIAN) --fail-on error$(comma)warning $(DEB_DIR)/*.changes,\
		@echo "deb: lintian not installed (apt-get install lintian), not checked")
