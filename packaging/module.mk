# packaging/: the systemd unit, sysusers.d and tmpfiles.d files, the default
# configuration and the man pages; debian/ builds the .debs from them.
#
#   make install-packaging     (the top-level `install` should depend on it)
#   make check-systemd         the end-to-end test under a real systemd
#                              (systemd-nspawn; builds its cached root first)
UNITDIR     ?= $(or $(shell $(PKG_CONFIG) --variable=systemdsystemunitdir systemd 2>/dev/null),/usr/lib/systemd/system)
SYSUSERSDIR ?= $(or $(shell $(PKG_CONFIG) --variable=sysusersdir systemd 2>/dev/null),/usr/lib/sysusers.d)
TMPFILESDIR ?= $(or $(shell $(PKG_CONFIG) --variable=tmpfilesdir systemd 2>/dev/null),/usr/lib/tmpfiles.d)
MANDIR      ?= $(PREFIX)/share/man

PACKAGING_MAN := packaging/man/edgelmctl.1 packaging/man/edgelm-bench.1 packaging/man/edgelm-gguf.1 \
		 packaging/man/edgelm-quantize.1 packaging/man/edgelm-run.1 packaging/man/edgelm.conf.5 \
		 packaging/man/edgelmd.8

.PHONY: install-packaging uninstall-packaging check-systemd

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

# The configuration stays (it may hold the admin's changes), as dpkg does.
uninstall-packaging:
	rm -f $(DESTDIR)$(UNITDIR)/edgelmd.service $(DESTDIR)$(SYSUSERSDIR)/edgelm.conf \
	      $(DESTDIR)$(TMPFILESDIR)/edgelm.conf
	for m in $(PACKAGING_MAN); do s=$${m##*.}; rm -f $(DESTDIR)$(MANDIR)/man$$s/$${m##*/}; done

# Needs root, systemd-nspawn and debootstrap (apt-get install
# systemd-container debootstrap); the root is cached in
# /var/cache/edgelm-test/root (EDGELM_E2E_ROOT), outside the tree.
check-systemd: all
	EDGELM_E2E_BUILD_ROOT=1 BUILD=$(BUILD) bash tests/integration/systemd_e2e.sh
